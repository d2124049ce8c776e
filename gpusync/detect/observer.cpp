// gpusync's op observer: the per-op half of a simulated scan, in C++.
//
// A Python TorchDispatchMode costs about 5 us per op, five times torch.profiler. This observer
// is a thread-local RecordFunction callback (the hook the profiler uses) that
//   - keeps the table of where tensors would live in a CUDA run (the device's tensors on the
//     virtual device, the host's in a simulated scan), and lets residency flow through ops:
//     an op's outputs are on the host only when all its tensor inputs are;
//   - calls back into Python only at ops that may sync (the rule table, copies across the
//     bus), with the op's arguments, so the rules stay in Python (detect/rules.py).
// It sees what a dispatch mode sees: ops as called, plus the ops a composite op decomposes
// into, but not the ops a kernel calls inside (a CPU kernel's own .item() is no CUDA sync).
#include <torch/extension.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/CPUAllocator.h>
#include <ATen/record_function.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <limits>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

using Impl = c10::TensorImpl;

// What an op is, computed once per overload.
constexpr uint8_t kOpaque = 1;  // it has its own kernel: ops it calls are its internals
constexpr uint8_t kRule = 2;    // Python decides whether it syncs
constexpr uint8_t kLift = 4;    // torch.tensor(data) enters here: host memory
constexpr uint8_t kKeep = 8;    // copy_: the destination stays where it is
// Opaque only through an Autograd kernel beside its composite one (matmul, linear: nested
// tensors' autograd kernel); a dense or sparse tensor runs the composite, whose ops are real.
constexpr uint8_t kAutogradOnly = 16;
constexpr uint8_t kFlops = 32;  // the cost model counts its FLOPs: its log entry keeps its arguments

// An opaque op with this many inner ops or more runs with RecordFunction off (ThreadState).
constexpr int kQuietFrom = 2;

// When a rule op is worth a call into Python.
enum Filter : uint8_t { kAnyDevice = 0, kSparse = 1, kLastDevice = 2, kCrossing = 3 };

struct OpInfo {
  uint8_t flags = 0;
  uint8_t filter = kAnyDevice;
  // An opaque op's inner ops, counted the first time it ran; -1 before. Ops with a few or more
  // are run with RecordFunction off (see ThreadState::quiet).
  int inner = -1;
  bool op = false;       // a dispatcher op, not a named range
  bool logged = false;   // an op the op log keeps: not record_function's markers
  std::string name;      // "aten::nonzero"
  std::string overload;  // "default", "Tensor", ...
  std::vector<std::pair<size_t, std::string>> kwonly;  // keyword-only arguments by position
  // CUDA's device check (detect/device_checks.py), with its arguments by position
  bool checked = false;
  bool check_iterator = false;  // TensorIterator's rule: a 0-dim host input is a CPU scalar
  std::vector<size_t> check_at;
  std::vector<std::string> check_names;
  std::vector<bool> check_outputs;
};

struct Frame {
  OpInfo* info;
  bool visible;
  bool recorded;
  bool all_host;
  bool has_tensor;
  bool names_device;   // a Device argument (a factory given TensorOptions with a device)
  Impl* self_host;     // the first argument, when it is a host tensor (in-place ops)
  uint64_t inner_at;   // inner_ops_ when the op began
  bool remember = false;  // not recorded: its outputs' forward line is still wanted
  bool opaque = false;    // its inner ops are only counted (kOpaque, but see start)
  int64_t logged = -1;    // its entry in the op log (OpLog), if it has one
  // The first host tensor inputs (the inputs are gone by the op's end: its outputs replace
  // them on the stack): an output that is one of them, handed back as it is, stays there.
  std::array<Impl*, 4> host_inputs{};
  uint8_t host_count = 0;
  bool host_input(Impl* impl) const {
    return std::find(host_inputs.begin(), host_inputs.begin() + host_count, impl) !=
           host_inputs.begin() + host_count;
  }
};

// What one pass over an op's tensor inputs found.
struct Inputs {
  bool any_device = false;
  bool any_host = false;
  bool any_sparse = false;
  bool last_device = false;  // the last argument is a device tensor
};

struct PtrPairHash {
  size_t operator()(const std::pair<const char*, const char*>& p) const {
    return std::hash<const void*>()(p.first) * 31 + std::hash<const void*>()(p.second);
  }
};

template <typename F>
void each_tensor(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    const auto& t = v.toTensor();
    if (t.defined()) f(t);
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorVector()) {
      if (t.defined()) f(t);
    }
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isTensor() && e.toTensor().defined()) f(e.toTensor());
    }
  }
}

// Which ops to ask Python about, and which make host tensors: one table for the process,
// set by detect/ops.py's _configure (the same each time; a change empties every thread's op
// table).
struct Config {
  std::mutex lock;
  std::unordered_map<std::string, uint8_t> rules;
  std::vector<std::string> lifts;
  std::vector<std::string> keeps;
  // Ops whose kernels are Python (torch.library custom ops): what they run inside runs on
  // CUDA as it is written, and what they keep (ctx stashes) must be followed.
  std::vector<std::string> transparent;
  std::vector<std::string> flops;  // ops with a FLOP formula (torch.utils.flop_counter)
  // The ops CUDA refuses a mix of devices to, by "name.overload": their checked arguments
  // and which of them are written (detect/device_checks.py).
  struct Check {
    bool iterator;
    std::vector<std::string> args;
    std::vector<bool> outputs;
  };
  std::unordered_map<std::string, Check> checks;
  std::atomic<uint64_t> version{0};
};
Config& config() {
  static Config* c = new Config();  // never destroyed: callbacks may run during exit
  return *c;
}

void add_rule(const std::string& name, uint8_t filter) {
  Config& c = config();
  std::lock_guard<std::mutex> guard(c.lock);
  auto it = c.rules.find(name);
  if (it != c.rules.end() && it->second == filter) return;
  c.rules[name] = filter;
  ++c.version;
}

void add_to(std::vector<std::string> Config::*list, const std::string& name) {
  Config& c = config();
  std::lock_guard<std::mutex> guard(c.lock);
  auto& names = c.*list;
  if (std::find(names.begin(), names.end(), name) != names.end()) return;
  names.push_back(name);
  ++c.version;
}

void add_check(const std::string& name, const std::string& overload, bool iterator,
               const std::vector<std::string>& args, const std::vector<bool>& outputs) {
  Config& c = config();
  std::lock_guard<std::mutex> guard(c.lock);
  c.checks[name + "." + overload] = Config::Check{iterator, args, outputs};
  ++c.version;
}

using OpKey = std::pair<const char*, const char*>;
constexpr size_t kRangesKept = 4096;

// What each op is, per thread and kept across sessions: a scan that starts (the pytest plugin
// starts one per test, `gpusync bench overhead` one per step) finds the ops it has seen before
// described, and their inner ops counted.
struct OpTable {
  uint64_t version = ~uint64_t{0};
  std::unordered_map<OpKey, OpInfo, PtrPairHash> ops;
  // A direct-mapped cache in front of the map: a step runs a few dozen distinct ops, and the
  // map's hashing and probing showed in profiles of the callback.
  struct Recent {
    OpKey key{nullptr, nullptr};
    OpInfo* info = nullptr;
  };
  std::array<Recent, 256> recent{};
};
OpTable& op_table();

// The tensors on one side of the bus, by TensorImpl. Shared by a session's observer and the
// followers it puts on other threads (follow_this_thread), hence the lock: uncontended, it
// costs a few tens of nanoseconds per op, next to microseconds for the op.
struct ResidencyTable {
  using Storages =
      std::unordered_map<c10::StorageImpl*, c10::weak_intrusive_ptr<c10::StorageImpl>>;
  std::mutex lock;
  std::unordered_map<Impl*, c10::weak_intrusive_ptr<Impl>> tensors;
  // The storages of what saved-tensor hooks were handed on the device (place_packed): a
  // tensor made from one by no op the observer sees (activation checkpointing keeps a
  // recomputed output's `detach()`) shares its storage and lives where it does.
  Storages storages;
  size_t sweep_at = 4096;
};


// -- the cost model's op log (`scan --gpu`, costmodel/native_log.py) ------------------------
// Every op the observer sees, with what the cost model needs: its tensors' shapes, dtypes and
// side of the bus, the thread's CPU clock around it and the arguments of ops with a FLOP
// formula. A Python dispatch mode recording the same cost about 20 us per op, and its Python
// left the CPU's caches cold for the user's code that followed: the Python between two ops
// then took several times what it takes outside the scan, and that is what the model reads
// as the user's host time.
double wall_now() {  // Python's time.perf_counter() clock
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}
double cpu_now() {  // Python's time.thread_time() clock
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}
long switches_now() {  // involuntary context switches of this thread (own_time.thread_clock)
#ifdef RUSAGE_THREAD
  rusage usage;
  if (getrusage(RUSAGE_THREAD, &usage) == 0) return usage.ru_nivcsw;
#endif
  return 0;
}

struct LoggedTensor {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  bool strided = true;  // false: no strides (sparse, nested)
  bool contiguous = true;
  c10::ScalarType dtype = c10::ScalarType::Float;
  bool device = false;
};

// A list of tensors (a formula reads none; keeping one would keep its tensors alive).
bool holds_tensors(const c10::IValue& v) {
  if (v.isTensorList()) return true;
  if (!v.isList()) return false;
  for (const c10::IValue& e : v.toListRef()) {
    if (e.isTensor() || e.isNone()) return true;  // Tensor?[]: None stands for a tensor
  }
  return false;
}

LoggedTensor logged_tensor(const at::Tensor& t, bool device) {
  LoggedTensor m;
  m.dtype = t.scalar_type();
  m.device = device;
  try {
    if (t.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
      for (const auto& s : t.sym_sizes()) m.sizes.push_back(s.guard_int(__FILE__, __LINE__));
      m.strided = false;
      return m;
    }
    m.sizes = t.sizes().vec();
    if (t.layout() == at::kStrided) {
      m.strides = t.strides().vec();
      m.contiguous = t.is_contiguous();
    } else {
      m.strided = false;
    }
  } catch (const std::exception&) {  // nested tensors have no sizes: shape unknown
    m.strided = false;
  }
  return m;
}

struct LoggedOp {
  const char* name;
  const char* overload;
  double wall = 0, wall_end = 0, cpu_start = 0, cpu_end = 0, kernel_s = 0;
  long switches_start = 0, switches_end = 0;
  bool from_engine = false;
  uint8_t tf32 = 0;  // bit 0: matmuls may use TF32, bit 1: cuDNN convolutions may
  std::vector<LoggedTensor> inputs, outputs;
  bool has_args = false;          // a kFlops op: the next three are kept
  std::vector<c10::IValue> args;  // its arguments, a tensor's place None
  std::vector<int> tensor_at;     // per argument: its index in inputs, or -1
  std::vector<int> output_at;     // per return: its index in outputs, or -1
};

class Observer {
 public:
  Observer(py::object on_rule, py::object on_recorded, bool tracks_device,
           py::object on_mixed = py::object(), py::object on_unraised = py::object())
      : on_rule_(std::move(on_rule)),
        on_recorded_(std::move(on_recorded)),
        on_mixed_(on_mixed.is_none() ? py::object() : std::move(on_mixed)),
        on_unraised_(on_unraised.is_none() ? py::object() : std::move(on_unraised)),
        tracks_device_(tracks_device),
        table_(std::make_shared<ResidencyTable>()) {}

  // A session nested in another on the virtual device (a scanned script's own watch()) knows
  // where the tensors made before it live: it keeps the outer session's table.
  void share_table(const Observer& outer) {
    if (outer.tracks_device_ == tracks_device_) table_ = outer.table_;
  }

  // An observer for another thread that only follows where ops put their outputs, into this
  // one's table: that thread's syncs are not the scanned step's (ops.py OpDetector.record).
  // It holds no Python object (null handles): it is destroyed on its thread, without the GIL.
  std::shared_ptr<Observer> follower() {
    auto f = std::make_shared<Observer>(py::object(), py::object(), tracks_device_);
    f->table_ = table_;
    f->follows_ = true;
    f->backward_on_device = backward_on_device;
    followers_.push_back(f);
    return f;
  }
  void close_followers() {
    for (auto& f : followers_) f->closed = true;
    followers_.clear();
  }

  // -- where tensors live ------------------------------------------------------------------
  // The table holds the tensors on one side; an untracked tensor is on the other. On the
  // virtual device it holds the device's tensors (`tracks_device`), so a tensor made where no
  // op is seen (an RNG state, frombuffer) is host memory, as on a CUDA build; a simulated scan
  // holds the host's (tensors from before the scan are the device's).
  // An entry for a live tensor is never expired: `t` holds the impl the weak ref points to.
  // The locked forms, for Python; the callbacks take the lock once per op half.
  bool is_host(const at::Tensor& t) const {
    std::lock_guard<std::mutex> guard(table_->lock);
    return host(t);
  }
  // Autograd saves an op's outputs for backward inside the op, before its RecordFunction
  // ends and settle() places them, and an opaque op's inner outputs are never placed: a
  // saved-tensor pack hook (activation checkpointing compares the devices that forward and
  // the recomputation saved; save_on_cpu copies device tensors off) is handed `tensor_data()`
  // of such an output, which the table does not know. Told of it before the hook runs
  // (detect/calls.py), it is placed where the op in flight puts its outputs, unless it shares
  // its storage with one of the op's host inputs (a saved input).
  void place_packed(const at::Tensor& t) {
    std::lock_guard<std::mutex> guard(table_->lock);
    if (!tracks_device_ || !(tracked(t) || in_flight_output(t))) return;
    to_device(t);
    // what the hook keeps of it may be made where no op is seen (the recomputation's detach
    // runs with the observer quiet): it lives where this storage does
    if (c10::StorageImpl* storage = storage_of(t.unsafeGetTensorImpl())) {
      table_->storages.insert_or_assign(
          storage, t.unsafeGetTensorImpl()->unsafe_storage().getWeakStorageImpl());
    }
  }
  bool in_flight_output(const at::Tensor& t) const {
    for (auto it = stack_.rbegin(); it != stack_.rend(); ++it) {
      if (!it->visible) continue;
      if (!it->has_tensor || it->all_host) return false;
      c10::StorageImpl* storage = storage_of(t.unsafeGetTensorImpl());
      for (uint8_t i = 0; i < it->host_count; ++i) {
        Impl* input = it->host_inputs[i];
        if (input == t.unsafeGetTensorImpl() || (storage && storage_of(input) == storage)) {
          return false;
        }
      }
      return true;
    }
    return false;
  }
  void mark_host(const at::Tensor& t) {
    std::lock_guard<std::mutex> guard(table_->lock);
    to_host(t);
  }
  void mark_device(const at::Tensor& t) {
    std::lock_guard<std::mutex> guard(table_->lock);
    to_device(t);
  }
  bool tracks_device() const { return tracks_device_; }

  int device_default = 0;  // >0: ops with no tensor input make device tensors (C++ buffers)
  // Where a backward pass's gradients live, for a factory handed a device at its top (no op
  // with tensor inputs around it): its roots' device, told by the Python layer around the
  // engine (ops.py OpDetector._backward_seen).
  bool backward_on_device = true;
  std::atomic<bool> closed{false};  // a follower is closed from the session's thread
  bool refuses = false;  // installed on the virtual device: the RefusingAllocator is its

  // -- the callback's two halves -----------------------------------------------------------
  // True when RecordFunction may be off while the op runs: an opaque op that ran inner ops.
  bool start(const at::RecordFunction& fn) {
    if (opaque_depth_ > 0) {  // an opaque op's inner op: only counted
      ++inner_ops_;
      stack_.push_back(Frame{nullptr, false, false, true, false, false, nullptr, 0});
      return false;
    }
    OpInfo& info = info_of(fn);
    const bool logging = logging_ && !follows_ && info.logged;
    const double wall = logging ? wall_now() : 0, cpu = logging ? cpu_now() : 0;
    const long switches = logging ? switches_now() : 0;
    double asked = 0;  // CPU seconds Python took to judge the op: gpusync's, not the kernel's
    Frame f{&info, true, false, true, false, false, nullptr, inner_ops_};
    auto inputs = fn.inputs();
    Inputs seen;
    std::unique_lock<std::mutex> guard(table_->lock);
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].isDevice()) f.names_device = true;
      each_tensor(inputs[i], [&](const at::Tensor& t) {
        if (t.unsafeGetTensorImpl()->is_wrapped_number()) return;  // a Python scalar
        f.has_tensor = true;
        bool host = this->host(t);
        (host ? seen.any_host : seen.any_device) = true;
        if (host && f.host_count < f.host_inputs.size()) {
          f.host_inputs[f.host_count++] = t.unsafeGetTensorImpl();
        }
        if (t.layout() == at::kSparse) seen.any_sparse = true;
        if (inputs[i].isTensor()) {
          if (i == 0 && host) f.self_host = t.unsafeGetTensorImpl();
          if (i + 1 == inputs.size() && !host) seen.last_device = true;
        }
      });
    }
    // Not in a backward pass: what forward saved for it from inside an opaque op (F.linear's
    // `weight.t()`) was never placed, and reads as host memory.
    std::vector<Operand> mixed;
    if (info.checked && tracks_device_ && !follows_ && seen.any_device && seen.any_host &&
        torch::autograd::get_current_graph_task_id() == -1) {
      mixed = refused_operands(info, inputs);
    }
    guard.unlock();  // Python may ask the table while it is asked about the op
    f.all_host = !seen.any_device;
    if (!mixed.empty()) ask_refusal(fn, mixed);
    // With a sparse operand, torch.matmul / `@` (kAutogradOnly) are looked into: they reach mm,
    // whose sparse operand coalesces on CUDA in forward or in backward (rules.py
    // SPARSE_MATMULS). Dense calls stay opaque, off the hot path.
    // Logging ops, they are looked into too: the ops they run are the ones logged.
    // With tensors on both sides of the bus, they are looked into for CUDA's device checks of
    // the ops they run (F.linear's addmm).
    const bool mixed_devices = seen.any_device && seen.any_host && on_mixed_ && !follows_;
    f.opaque = (info.flags & kOpaque) &&
               !((info.flags & kAutogradOnly) &&
                 (seen.any_sparse || (logging_ && !follows_) || mixed_devices));
    if (f.opaque) ++opaque_depth_;
    if ((info.flags & kRule) && !follows_ && recorded_depth_ == 0 &&
        worth_asking(info.filter, seen)) {
      const double before = logging ? cpu_now() : 0;
      int answer = ask(info, inputs);
      if (logging) asked = cpu_now() - before;
      f.recorded = answer == kRecorded;
      f.remember = answer == kRemember;
      if (f.recorded) ++recorded_depth_;
    }
    if (logging) f.logged = log_start(fn, info, inputs, wall, cpu, switches, asked);
    stack_.push_back(f);
    return f.opaque && info.inner >= kQuietFrom;
  }

  // CUDA's error for the op that just began, if it refuses its mix of devices: the thread
  // raises it at the op's first allocation (RefusingAllocator).
  bool refuses_op() const { return !refusal_.empty(); }
  std::string take_refusal() { return std::exchange(refusal_, std::string()); }

  // The op CUDA refuses allocated nothing (in place, out=): it ran. Python notes it and
  // hands back CUDA's error, which the thread raises when it next runs Python (as soon as
  // this callback is over: an exception cannot leave it, nor be raised inside it).
  void unraised(const std::string& message) {
    if (!on_unraised_) return;
    py::gil_scoped_acquire gil;
    try {
      py::object error = on_unraised_(py::str(message));
      if (!error.is_none()) raise_soon(error.ptr());
    } catch (py::error_already_set& e) {
      unraisable(e, on_unraised_);
    }
  }

  void end(const at::RecordFunction& fn) {
    if (stack_.empty()) return;  // installed while the op ran
    Frame f = stack_.back();
    stack_.pop_back();
    if (!f.visible) return;
    const double entered = f.logged >= 0 ? cpu_now() : 0;
    settle(fn, f);
    if (f.logged >= 0 && static_cast<size_t>(f.logged) < log_.size()) {
      log_end(log_[f.logged], fn.outputs(), entered);
    }
  }

  // Where the outputs of an op that ended live, and what Python hears of it.
  void settle(const at::RecordFunction& fn, const Frame& f) {
    const uint8_t flags = f.info->flags;
    if (f.opaque) {
      --opaque_depth_;
      if (f.info->inner < 0) f.info->inner = static_cast<int>(inner_ops_ - f.inner_at);
    }
    if (f.recorded) --recorded_depth_;
    const auto& outputs = fn.outputs();
    if ((f.recorded || f.remember) && needs_grad(outputs)) recorded(outputs, f.recorded);
    if (flags & kKeep) return;
    std::lock_guard<std::mutex> guard(table_->lock);
    const bool for_device =
        !f.has_tensor && (device_default > 0 || (f.names_device && context_on_device()));
    if ((flags & kLift) || (f.all_host && !for_device)) {
      for (const auto& o : outputs) each_tensor(o, [&](const at::Tensor& t) { to_host(t); });
    } else if (for_device) {
      for (const auto& o : outputs) each_tensor(o, [&](const at::Tensor& t) { to_device(t); });
    } else if (tracks_device_) {
      // A device input puts the outputs on the device; an output that is a host input handed
      // back as it is (`to` / `contiguous` with nothing to do) stays where it is, unless the
      // op wrote it in place.
      for (const auto& o : outputs) {
        each_tensor(o, [&](const at::Tensor& t) {
          Impl* impl = t.unsafeGetTensorImpl();
          // tracked by itself even where its storage says so already: marks by storage alone
          // would not outlive the tensor that put the storage there
          if (table_->tensors.count(impl) != 0 || (impl != f.self_host && f.host_input(impl))) {
            return;
          }
          to_device(t);
        });
      }
    } else if (f.self_host != nullptr) {  // an in-place op on a host tensor with device inputs
      for (const auto& o : outputs) {
        each_tensor(o, [&](const at::Tensor& t) {
          if (t.unsafeGetTensorImpl() == f.self_host) to_device(t);
        });
      }
    }
  }

  // A factory that was handed a device (TensorOptions) from C++ code: `at::zeros(sizes,
  // grad.options())` in a backward formula, or a composite op's allocation from its input's
  // options. On CUDA that device is the tensor's it came from: the inputs of the op it runs
  // in, or, at the top of a backward pass, the gradients'. (A Python-level factory given
  // device= is decided again by its call layer, detect/calls.py.)
  bool context_on_device() const {
    for (auto it = stack_.rbegin(); it != stack_.rend(); ++it) {
      if (it->visible && it->has_tensor) return !it->all_host;
    }
    return backward_on_device && torch::autograd::get_current_graph_task_id() != -1;
  }

  void reset_stack() {
    stack_.clear();
    opaque_depth_ = recorded_depth_ = 0;
  }

  void log_ops(bool on) { logging_ = on; }

  // The ops logged since the last call, as tuples (costmodel/native_log.py reads them), and
  // the log emptied.
  py::list take_ops() {
    py::list out;
    for (const LoggedOp& op : log_) out.append(logged_tuple(op));
    log_.clear();
    return out;
  }

 private:
  int64_t log_start(const at::RecordFunction& fn, const OpInfo& info,
                    c10::ArrayRef<const c10::IValue> inputs, double wall, double cpu,
                    long switches, double asked) {
    LoggedOp op;
    op.name = fn.name();
    op.overload = fn.overload_name();
    op.wall = wall;
    op.cpu_start = cpu;
    op.switches_start = switches;
    op.kernel_s = -asked;  // log_end adds the op's whole time
    op.from_engine = torch::autograd::get_current_graph_task_id() != -1;
    op.has_args = (info.flags & kFlops) != 0;
    if (op.has_args) {
      auto& ctx = at::globalContext();
      op.tf32 = static_cast<uint8_t>(
          (ctx.allowTF32CuBLAS() ||
           ctx.float32MatmulPrecision() != at::Float32MatmulPrecision::HIGHEST) |
          (ctx.allowTF32CuDNN() ? 2 : 0));
    }
    std::lock_guard<std::mutex> guard(table_->lock);
    for (const c10::IValue& value : inputs) {
      int slot = log_tensors(value, op.inputs);
      if (op.has_args) {
        op.tensor_at.push_back(slot);
        op.args.push_back(value.isTensor() || holds_tensors(value) ? c10::IValue() : value);
      }
    }
    log_.push_back(std::move(op));
    return static_cast<int64_t>(log_.size()) - 1;
  }

  void log_end(LoggedOp& op, const std::vector<c10::IValue>& outputs, double entered) {
    op.kernel_s = std::max(0.0, op.kernel_s + entered - op.cpu_start);
    {
      std::lock_guard<std::mutex> guard(table_->lock);
      for (const c10::IValue& value : outputs) {
        int slot = log_tensors(value, op.outputs);
        if (op.has_args) op.output_at.push_back(slot);
      }
    }
    op.switches_end = switches_now();
    op.wall_end = wall_now();
    op.cpu_end = cpu_now();
  }

  // The value's tensors appended to `to`, each with its side of the bus (the table's lock
  // held): the index of its tensor where the value is one tensor, else -1.
  int log_tensors(const c10::IValue& value, std::vector<LoggedTensor>& to) const {
    int slot = -1;
    each_tensor(value, [&](const at::Tensor& t) {
      if (value.isTensor()) slot = static_cast<int>(to.size());
      to.push_back(logged_tensor(t, !host(t)));
    });
    return slot;
  }

  static py::tuple tensor_tuple(const LoggedTensor& m) {
    py::object strides = m.strided ? py::object(py::cast(m.strides)) : py::none();
    auto dtype = py::reinterpret_borrow<py::object>(
        reinterpret_cast<PyObject*>(torch::getTHPDtype(m.dtype)));
    return py::make_tuple(py::cast(m.sizes), strides, m.contiguous, dtype, m.device);
  }

  static py::tuple logged_tuple(const LoggedOp& op) {
    py::list inputs, outputs;
    for (const auto& m : op.inputs) inputs.append(tensor_tuple(m));
    for (const auto& m : op.outputs) outputs.append(tensor_tuple(m));
    py::object args = py::none();
    if (op.has_args) {
      py::list values;
      for (const auto& v : op.args) values.append(torch::jit::toPyObject(v));
      args = py::make_tuple(values, py::cast(op.tensor_at), py::cast(op.output_at),
                            static_cast<int>(op.tf32));
    }
    return py::make_tuple(std::string(op.name), std::string(op.overload), op.wall,
                          op.wall_end, op.cpu_start, op.cpu_end, op.kernel_s, op.switches_start,
                          op.switches_end, op.from_engine, inputs, outputs, args);
  }

  static OpInfo& info_of(const at::RecordFunction& fn) {
    OpTable& table = op_table();
    Config& c = config();
    uint64_t version = c.version.load(std::memory_order_relaxed);
    if (table.version != version) {
      table.ops.clear();
      table.recent.fill({});
      table.version = version;
    }
    OpKey key{fn.name(), fn.overload_name()};
    auto& recent = table.recent[(reinterpret_cast<uintptr_t>(key.first) >> 4) % 256];
    if (recent.key == key) return *recent.info;
    auto it = table.ops.find(key);
    if (it == table.ops.end()) {
      OpInfo info = describe(fn, c);
      // A range that is no op may be named by a string that dies with it, whose address a
      // later range reuses: past a bound, those are not kept (all describe alike).
      if (!info.op && info.flags == 0 && table.ops.size() >= kRangesKept) {
        static OpInfo range;
        return range;
      }
      it = table.ops.emplace(key, std::move(info)).first;
    }
    recent = {key, &it->second};  // the map's nodes do not move
    return it->second;
  }

  static OpInfo describe(const at::RecordFunction& fn, Config& c) {
    std::lock_guard<std::mutex> guard(c.lock);
    OpInfo info;
    std::string name = fn.name();
    std::string overload = fn.overload_name();
    auto op = c10::Dispatcher::singleton().findOp({name, overload});
    // Ranges that are no op (the autograd engine's, record_function's) enclose user code.
    bool decomposes = !op;
    bool autograd_only = false;
    if (op) {
      using K = c10::DispatchKey;
      decomposes = op->hasKernelForDispatchKey(K::CompositeImplicitAutograd);
      autograd_only = decomposes;
      for (K k : {K::CPU, K::CUDA, K::CompositeExplicitAutograd,
                  K::CompositeExplicitAutogradNonFunctional, K::Autograd, K::AutogradCPU,
                  K::AutogradCUDA}) {
        if (op->hasKernelForDispatchKey(k)) {
          decomposes = false;
          if (k != K::Autograd) autograd_only = false;
        }
      }
    }
    if (std::find(c.transparent.begin(), c.transparent.end(), name) != c.transparent.end()) {
      decomposes = true;
    }
    if (!decomposes) info.flags |= kOpaque;
    if (!decomposes && autograd_only) info.flags |= kAutogradOnly;
    info.op = static_cast<bool>(op);
    // What a dispatch mode sees: ops with kernels of their own, not the composites that
    // decompose into them (matmul for dense tensors runs mm), nor record_function's markers.
    info.logged = info.op && !decomposes && !autograd_only && name.rfind("profiler::", 0) != 0;
    auto rule = c.rules.find(name);
    if (rule != c.rules.end()) {
      info.flags |= kRule;
      info.filter = rule->second;
      info.name = name;
      info.overload = overload.empty() ? "default" : overload;
      if (op) {
        const auto& args = op->schema().arguments();
        for (size_t i = 0; i < args.size(); ++i) {
          if (args[i].kwarg_only()) info.kwonly.emplace_back(i, args[i].name());
        }
      }
    }
    auto check = c.checks.find(name + "." + overload);
    if (op && check != c.checks.end()) {
      const auto& args = op->schema().arguments();
      const Config::Check& spec = check->second;
      for (size_t k = 0; k < spec.args.size(); ++k) {
        for (size_t i = 0; i < args.size(); ++i) {
          if (args[i].name() != spec.args[k]) continue;
          info.check_at.push_back(i);
          info.check_names.push_back(spec.args[k]);
          info.check_outputs.push_back(spec.outputs[k]);
        }
      }
      info.check_iterator = spec.iterator;
      info.checked = info.check_at.size() == spec.args.size();  // else another schema: not judged
    }
    auto listed = [&](const std::vector<std::string>& names) {
      return std::find(names.begin(), names.end(), name) != names.end();
    };
    if (listed(c.lifts)) info.flags |= kLift;
    if (listed(c.keeps)) info.flags |= kKeep;
    if (listed(c.flops)) info.flags |= kFlops;
    return info;
  }

  static bool worth_asking(uint8_t filter, const Inputs& seen) {
    switch (filter) {
      case kSparse: return seen.any_sparse && seen.any_device;
      case kLastDevice: return seen.last_device;
      case kCrossing: return seen.any_device && seen.any_host;
      default: return seen.any_device;
    }
  }

  // Python's answer (OpDetector._on_rule): nothing, a recorded sync, or no sync but a forward
  // line to keep on the op's autograd node (a sparse matmul, whose backward coalesces).
  static constexpr int kRecorded = 1;
  static constexpr int kRemember = 2;

  int ask(const OpInfo& info, c10::ArrayRef<const c10::IValue> inputs) {
    py::gil_scoped_acquire gil;
    try {
      py::list args;
      py::dict kwargs;
      size_t k = 0;
      for (size_t i = 0; i < inputs.size(); ++i) {
        py::object value = torch::jit::toPyObject(inputs[i]);
        if (k < info.kwonly.size() && info.kwonly[k].first == i) {
          kwargs[py::str(info.kwonly[k++].second)] = value;
        } else {
          args.append(value);
        }
      }
      return on_rule_(py::str(info.name), py::str(info.overload), py::tuple(args), kwargs)
          .cast<int>();
    } catch (py::error_already_set& e) {
      unraisable(e, on_rule_);
      return 0;
    }
  }

  // An op CUDA checks (detect/device_checks.py) was handed host and device tensors: its checked
  // operands, when they are plain host tensors whose mix CUDA refuses (TensorIterator takes a
  // 0-dim host input as a CPU scalar), else none. Python words the error (device_checks.py
  // DeviceCheck.refusal), so this is the whole of the rule's cost on a step that runs.
  struct Operand {
    std::string name;
    bool device;
    int64_t dim;
  };
  std::vector<Operand> refused_operands(const OpInfo& info,
                                        c10::ArrayRef<const c10::IValue> inputs) const {
    std::vector<Operand> operands;
    bool plain = true, any_device = false, refused_host = false;
    for (size_t k = 0; k < info.check_at.size() && plain; ++k) {
      if (info.check_at[k] >= inputs.size()) return {};
      each_tensor(inputs[info.check_at[k]], [&](const at::Tensor& t) {
        Impl* impl = t.unsafeGetTensorImpl();
        if (!t.is_cpu() || t.layout() != at::kStrided || impl->is_wrapped_number()) {
          plain = false;  // a meta tensor, a sparse one, a Python scalar: not judged
          return;
        }
        bool device = !host(t);
        any_device = any_device || device;
        if (!device && (!info.check_iterator || info.check_outputs[k] || t.dim() != 0)) {
          refused_host = true;
        }
        operands.push_back(Operand{info.check_names[k], device, t.dim()});
      });
    }
    if (!(plain && any_device && refused_host)) operands.clear();
    return operands;
  }

  void ask_refusal(const at::RecordFunction& fn, const std::vector<Operand>& operands) {
    if (!on_mixed_) return;
    py::gil_scoped_acquire gil;
    try {
      py::list items;
      for (const Operand& o : operands) items.append(py::make_tuple(o.name, o.device, o.dim));
      // the op's arguments too: a convolution's error depends on the backend CUDA picks for
      // them (device_checks_conv.py); only a mix CUDA may refuse comes this way
      py::list arguments;
      for (const c10::IValue& v : fn.inputs()) arguments.append(torch::jit::toPyObject(v));
      py::object answer = on_mixed_(py::str(fn.name()), py::str(fn.overload_name()), items,
                                    py::tuple(arguments));
      if (!answer.is_none()) refusal_ = answer.cast<std::string>();
    } catch (py::error_already_set& e) {
      unraisable(e, on_mixed_);
    }
  }

  static bool needs_grad(const std::vector<c10::IValue>& outputs) {
    bool any = false;
    for (const auto& o : outputs) {
      each_tensor(o, [&](const at::Tensor& t) { any = any || t.requires_grad(); });
    }
    return any;
  }

  // Python gets the outputs of an op it recorded (or asked to remember) that autograd will run
  // backward through (their node is set by now): a sync in that backward is shown at the
  // forward line.
  void recorded(const std::vector<c10::IValue>& outputs, bool was_recorded) {
    py::gil_scoped_acquire gil;
    try {
      py::list values;
      for (const auto& o : outputs) values.append(torch::jit::toPyObject(o));
      on_recorded_(py::tuple(values), py::bool_(was_recorded));
    } catch (py::error_already_set& e) {
      unraisable(e, on_recorded_);
    }
  }

  // An exception cannot leave a RecordFunction callback: report it, and let Ctrl-C reach the
  // next Python bytecode.
  static void unraisable(py::error_already_set& e, const py::object& where) {
    bool interrupt = e.matches(PyExc_KeyboardInterrupt);
    if (refusal_to_raise != nullptr && e.matches(refusal_to_raise)) {
      raise_soon(refusal_to_raise);  // it fell in one of gpusync's callbacks: raise it again
      return;
    }
    e.restore();
    PyErr_WriteUnraisable(where.ptr());
    if (interrupt) PyErr_SetInterrupt();
  }

  // The GIL held: the exception class raised in this thread at its next Python bytecode.
  static inline PyObject* refusal_to_raise = nullptr;  // the latest, kept alive
  static void raise_soon(PyObject* error) {
    if (error != refusal_to_raise) {
      Py_INCREF(error);
      Py_XDECREF(refusal_to_raise);
      refusal_to_raise = error;
    }
    PyThreadState_SetAsyncExc(PyThread_get_thread_ident(), error);
  }

  // The table's lock held:
  bool host(const at::Tensor& t) const { return tracked(t) != tracks_device_; }
  bool tracked(const at::Tensor& t) const {
    const auto& tensors = table_->tensors;
    Impl* impl = t.unsafeGetTensorImpl();
    if (tensors.count(impl) != 0) return true;
    c10::StorageImpl* storage = storage_of(impl);
    return storage != nullptr && live(table_->storages, storage);
  }
  static bool live(const ResidencyTable::Storages& storages, c10::StorageImpl* storage) {
    auto found = storages.find(storage);
    return found != storages.end() && !found->second.expired();
  }
  static c10::StorageImpl* storage_of(Impl* impl) {
    return impl->has_storage() ? impl->unsafe_storage().unsafeGetStorageImpl() : nullptr;
  }
  void to_host(const at::Tensor& t) { tracks_device_ ? untrack(t) : track(t); }
  void to_device(const at::Tensor& t) { tracks_device_ ? track(t) : untrack(t); }
  void track(const at::Tensor& t) {
    if (!t.defined()) return;
    auto& tensors = table_->tensors;
    Impl* impl = t.unsafeGetTensorImpl();
    bool added = tensors.try_emplace(impl, c10::weak_intrusive_ptr<Impl>(t.getIntrusivePtr()))
                     .second;
    if (added && tensors.size() > table_->sweep_at) sweep();
  }
  // A packed storage stays the device's: on CUDA a tensor sharing a device tensor's memory is
  // on the device whatever marked it (entries go when the storage dies).
  void untrack(const at::Tensor& t) {
    if (t.defined()) table_->tensors.erase(t.unsafeGetTensorImpl());
  }

  void sweep() {
    auto& tensors = table_->tensors;
    for (auto it = tensors.begin(); it != tensors.end();) {
      it = it->second.expired() ? tensors.erase(it) : std::next(it);
    }
    auto& storages = table_->storages;
    for (auto it = storages.begin(); it != storages.end();) {
      it = it->second.expired() ? storages.erase(it) : std::next(it);
    }
    table_->sweep_at = std::max<size_t>(4096, tensors.size() * 2);
  }

  py::object on_rule_;
  py::object on_recorded_;
  py::object on_mixed_;    // Python's wording of CUDA's device-mismatch error, or None
  py::object on_unraised_;  // told of such an error the op could not raise
  std::string refusal_;    // that error for the op that just began
  bool tracks_device_;
  std::shared_ptr<ResidencyTable> table_;
  bool follows_ = false;  // a follower: residency only, no rules
  std::vector<std::shared_ptr<Observer>> followers_;  // closed with this observer
  std::vector<Frame> stack_;
  uint64_t inner_ops_ = 0;
  int opaque_depth_ = 0;
  int recorded_depth_ = 0;
  bool logging_ = false;  // log_ops(True): `scan --gpu` records every op here (LoggedOp)
  std::vector<LoggedOp> log_;
};

// What this thread holds, in one thread_local: each access to one costs a call in a shared
// library, and the callbacks run on every op.
struct ThreadState {
  std::vector<Observer*> observers;  // sessions may nest; the callback is registered once
  at::CallbackHandle handle = 0;
  // RecordFunction is off while an opaque op with a few inner ops or more runs: those inner
  // ops, which no observer looks at, then cost nothing, where each would box its inputs and
  // outputs for our callback (embedding_bag runs dozens). Turning it off and on costs about
  // two inner ops, hence the learned count. With inner ops gone, the next end callback is
  // the opaque op's own.
  bool quiet = false;
  OpTable ops;
  // Followers of sessions on other threads (Observer::follower), held here so that they
  // outlive their session; a closed one is dropped at this thread's next op.
  std::vector<std::shared_ptr<Observer>> followers;
  // CUDA's device-mismatch error for the op begun at `refusal_depth` (ops nest: `depth`),
  // raised by its first allocation; dropped at its end if it allocated nothing.
  std::string refusal;
  Observer* refused_by = nullptr;
  int depth = 0;
  int refusal_depth = 0;
};
thread_local ThreadState tls;
// Whether tls.refusal is set: a plain flag, so that the allocator, which every thread calls,
// never constructs a ThreadState where none is (nor touches one its thread has destroyed).
thread_local bool refusal_pending = false;

// The CPU allocator while an observer on the virtual device is installed: it raises the error
// CUDA raises where an op's tensors are on both sides of the bus. A RecordFunction callback
// cannot throw, and the op's kernel was chosen before it ran; its output's allocation is the
// first point inside the op where an exception leaves as CUDA's does, as a RuntimeError at
// the op's line. An op that allocates nothing (in place, out=) runs on, unrefused.
struct RefusingAllocator final : c10::Allocator {
  std::atomic<c10::Allocator*> inner{nullptr};
  c10::DataPtr allocate(size_t n) override {
    if (C10_UNLIKELY(refusal_pending)) {
      refusal_pending = false;
      std::string message = std::exchange(tls.refusal, std::string());
      TORCH_CHECK(false, message);
    }
    return inner.load()->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return inner.load()->raw_deleter(); }
  bool is_simple_data_ptr(const c10::DataPtr& p) const override {
    return inner.load()->is_simple_data_ptr(p);
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    inner.load()->copy_data(dest, src, count);
  }
};
// Never destroyed: storages made while it was installed keep it as their allocator.
RefusingAllocator& refusing() {
  static auto* a = new RefusingAllocator();
  return *a;
}
std::mutex refusing_lock;
int refusing_users = 0;

void refuse_on() {
  std::lock_guard<std::mutex> guard(refusing_lock);
  RefusingAllocator& a = refusing();
  if (refusing_users++ == 0 && c10::GetCPUAllocator() != &a) {
    a.inner = c10::GetCPUAllocator();
    c10::SetCPUAllocator(&a, 0);  // not over an allocator set with a higher priority
  }
}

void refuse_off() {
  std::lock_guard<std::mutex> guard(refusing_lock);
  RefusingAllocator& a = refusing();
  if (--refusing_users == 0 && c10::GetCPUAllocator() == &a) {
    c10::SetCPUAllocator(a.inner.load(), 0);
  }
}

OpTable& op_table() { return tls.ops; }

// Only when this thread's callback is the sole one: a profiler running beside the scan still
// sees every op.
bool alone() {
  return !at::hasGlobalCallbacks() &&
         at::get_record_function_tls_().sorted_tls_callbacks_.size() == 1;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  ThreadState& t = tls;
  bool quiet = false;
  ++t.depth;
  std::string refusal;
  Observer* refused_by = nullptr;
  for (Observer* o : t.observers) {
    if (!o->closed && o->start(fn)) quiet = true;
    if (!o->refuses_op()) continue;
    std::string r = o->take_refusal();  // taken from each: none is left for the next op
    if (refusal.empty()) {
      refusal = std::move(r);
      refused_by = o;
    }
  }
  if (!t.followers.empty()) {
    auto& fs = t.followers;
    fs.erase(std::remove_if(fs.begin(), fs.end(), [](const auto& f) { return f->closed.load(); }),
             fs.end());
    for (auto& f : fs) {
      if (f->start(fn)) quiet = true;
    }
  }
  if (quiet && !t.quiet && alone()) {
    t.quiet = true;
    at::enableRecordFunction(false);
  }
  // set last: what the callbacks above allocate is no part of the op
  if (!refusal.empty() && t.refusal.empty()) {
    refusal_pending = true;
    t.refusal = std::move(refusal);
    t.refused_by = refused_by;
    t.refusal_depth = t.depth;
  }
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  ThreadState& t = tls;
  if (!t.refusal.empty() && t.depth <= t.refusal_depth) {
    refusal_pending = false;
    std::string message = std::exchange(t.refusal, std::string());
    Observer* o = t.refused_by;
    if (o != nullptr && !o->closed &&
        std::find(t.observers.begin(), t.observers.end(), o) != t.observers.end()) {
      o->unraised(message);
    }
  }
  if (t.depth > 0) --t.depth;
  if (t.quiet) {
    t.quiet = false;
    at::enableRecordFunction(true);
  }
  for (auto it = t.followers.rbegin(); it != t.followers.rend(); ++it) {
    if (!(*it)->closed) (*it)->end(fn);
  }
  for (auto it = t.observers.rbegin(); it != t.observers.rend(); ++it) {
    if (!(*it)->closed) (*it)->end(fn);
  }
}

void add_callback(ThreadState& t) {
  if (t.handle == 0) {
    t.depth = 0;
    t.refusal.clear();
    refusal_pending = false;
    t.handle = at::addThreadLocalCallback(
        at::RecordFunctionCallback(on_start, on_end)
            .needsInputs(true)
            .needsOutputs(true)
            .scopes({at::RecordScope::FUNCTION}));
  }
}

void install(Observer& o) {
  o.closed = false;
  o.reset_stack();
  if (o.tracks_device() && !o.refuses) {
    o.refuses = true;
    refuse_on();
  }
  ThreadState& t = tls;
  t.observers.push_back(&o);
  add_callback(t);
}

// The calling thread (not the session's) follows where its ops put tensors, into o's table.
void follow_this_thread(Observer& o) {
  ThreadState& t = tls;
  t.followers.push_back(o.follower());
  add_callback(t);
}

void uninstall(Observer& o) {
  o.closed = true;  // on another thread: it stays registered there, and does nothing
  o.close_followers();
  if (o.refuses) {
    o.refuses = false;
    refuse_off();
  }
  ThreadState& t = tls;
  auto it = std::find(t.observers.begin(), t.observers.end(), &o);
  if (it == t.observers.end()) return;
  t.observers.erase(it);
  if (t.quiet) {  // uninstalled inside an opaque op (by Python code it runs)
    t.quiet = false;
    at::enableRecordFunction(true);
  }
  auto& fs = t.followers;
  fs.erase(std::remove_if(fs.begin(), fs.end(), [](const auto& f) { return f->closed.load(); }),
           fs.end());
  if (t.observers.empty() && fs.empty() && t.handle != 0) {
    at::removeCallback(t.handle);
    t.handle = 0;
  }
}

// torch.device(0) on the virtual device. A CPU build resolves a bare index against the current
// accelerator in C++ (THPDevice_pynew) and has none; torch.device is a static C type that
// Python cannot subclass or patch without breaking `type(d) is torch.device`. So while a
// virtual scan runs, the type's tp_new reads a lone int as cuda:INDEX, as a one-GPU build
// does, and hands everything else to torch's own.
newfunc original_device_new = nullptr;

PyObject* virtual_device_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  if (type == &THPDeviceType && (kwargs == nullptr || PyDict_Size(kwargs) == 0) &&
      PyTuple_GET_SIZE(args) == 1) {
    PyObject* arg = PyTuple_GET_ITEM(args, 0);
    if (PyLong_Check(arg) && !PyBool_Check(arg)) {
      long index = PyLong_AsLong(arg);
      if (index >= 0 && index <= std::numeric_limits<c10::DeviceIndex>::max()) {
        return THPDevice_New(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index)));
      }
      PyErr_Clear();  // out of range: torch's own message
    }
  }
  return original_device_new(type, args, kwargs);
}

void virtual_device_index(bool on) {
  if (original_device_new == nullptr) original_device_new = THPDeviceType.tp_new;
  THPDeviceType.tp_new = on ? virtual_device_new : original_device_new;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // add_rule's filters, by the names detect/rules.py's ASK_WHEN uses.
  py::dict filters;
  filters["any input on the device"] = static_cast<int>(kAnyDevice);
  filters["sparse input"] = static_cast<int>(kSparse);
  filters["last input on the device"] = static_cast<int>(kLastDevice);
  filters["crossing"] = static_cast<int>(kCrossing);
  m.attr("FILTERS") = filters;
  m.def("add_rule", &add_rule);
  m.def("add_lift", [](const std::string& name) { add_to(&Config::lifts, name); });
  m.def("virtual_device_index", &virtual_device_index);
  m.def("add_keep", [](const std::string& name) { add_to(&Config::keeps, name); });
  m.def("add_transparent", [](const std::string& name) { add_to(&Config::transparent, name); });
  m.def("add_flops", [](const std::string& name) { add_to(&Config::flops, name); });
  m.def("add_check", &add_check);
  m.def("refusing_allocator_installed",
        [] { return c10::GetCPUAllocator() == &refusing(); });
  py::class_<Observer>(m, "Observer")
      .def(py::init<py::object, py::object, bool, py::object, py::object>(),
           py::arg("on_rule"), py::arg("on_recorded"), py::arg("tracks_device") = false,
           py::arg("on_mixed") = py::none(), py::arg("on_unraised") = py::none())
      .def("is_host", &Observer::is_host)
      .def("on_device", [](const Observer& o, const at::Tensor& t) { return !o.is_host(t); })
      .def("place_packed", &Observer::place_packed)
      .def_property_readonly("tracks_device", &Observer::tracks_device)
      .def_readwrite("backward_on_device", &Observer::backward_on_device)
      .def("mark_host", &Observer::mark_host)
      .def("mark_device", &Observer::mark_device)
      .def_readwrite("device_default", &Observer::device_default)
      .def("install", [](Observer& o) { install(o); })
      .def("uninstall", [](Observer& o) { uninstall(o); })
      .def("follow_this_thread", [](Observer& o) { follow_this_thread(o); })
      .def("share_table", &Observer::share_table)
      .def("log_ops", &Observer::log_ops)
      .def("take_ops", &Observer::take_ops);
}
