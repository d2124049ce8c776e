// gpusync's op observer: the per-op half of a simulated scan, in C++.
//
// A Python TorchDispatchMode costs about 5 us per op, five times torch.profiler. This observer
// is a thread-local RecordFunction callback (the hook the profiler uses) that
//   - keeps the set of tensors that would live on the host in a CUDA run, and lets host-ness
//     flow through ops: an op's outputs are on the host only when all its tensor inputs are;
//   - calls back into Python only at ops that may sync (the rule table, copies across the
//     bus), with the op's arguments, so the rules stay in Python (detect/rules.py).
// It sees what a dispatch mode sees: ops as called, plus the ops a composite op decomposes
// into, but not the ops a kernel calls inside (a CPU kernel's own .item() is no CUDA sync).
#include <torch/extension.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <algorithm>
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

// When a rule op is worth a call into Python.
enum Filter : uint8_t { kAnyDevice = 0, kSparse = 1, kLastDevice = 2, kCrossing = 3 };

struct OpInfo {
  uint8_t flags = 0;
  uint8_t filter = kAnyDevice;
  py::object name;      // "aten::nonzero"
  py::object overload;  // "default", "Tensor", ...
  std::vector<std::pair<size_t, py::object>> kwonly;  // keyword-only arguments by position
};

struct Frame {
  uint8_t flags;
  bool visible;
  bool recorded;
  bool all_host;
  bool has_tensor;
  Impl* self_host;  // the first argument, when it is a host tensor (in-place ops)
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

class Observer {
 public:
  Observer(py::object on_rule, py::object on_recorded)
      : on_rule_(std::move(on_rule)), on_recorded_(std::move(on_recorded)) {}

  // -- where tensors live ------------------------------------------------------------------
  // An entry for a live tensor is never expired: `t` holds the impl the weak ref points to.
  bool is_host(const at::Tensor& t) const { return host_.count(t.unsafeGetTensorImpl()) != 0; }
  void mark_host(const at::Tensor& t) {
    if (!t.defined()) return;
    bool added = host_.try_emplace(t.unsafeGetTensorImpl(),
                                   c10::weak_intrusive_ptr<Impl>(t.getIntrusivePtr()))
                     .second;
    if (added && host_.size() > sweep_at_) sweep();
  }
  void mark_device(const at::Tensor& t) {
    if (t.defined()) host_.erase(t.unsafeGetTensorImpl());
  }

  // -- configuration from Python -----------------------------------------------------------
  void add_rule(const std::string& name, uint8_t filter) { rules_[name] = filter; }
  void add_lift(const std::string& name) { lifts_.push_back(name); }
  void add_keep(const std::string& name) { keeps_.push_back(name); }
  int device_default = 0;  // >0: ops with no tensor input make device tensors (C++ buffers)
  bool closed = false;

  // -- the callback's two halves -----------------------------------------------------------
  void start(const at::RecordFunction& fn) {
    OpInfo& info = info_of(fn);
    Frame f{info.flags, opaque_depth_ == 0, false, true, false, nullptr};
    if (info.flags & kOpaque) ++opaque_depth_;
    if (f.visible) {
      auto inputs = fn.inputs();
      Inputs seen;
      for (size_t i = 0; i < inputs.size(); ++i) {
        each_tensor(inputs[i], [&](const at::Tensor& t) {
          if (t.unsafeGetTensorImpl()->is_wrapped_number()) return;  // a Python scalar
          f.has_tensor = true;
          bool host = is_host(t);
          (host ? seen.any_host : seen.any_device) = true;
          if (t.layout() == at::kSparse) seen.any_sparse = true;
          if (inputs[i].isTensor()) {
            if (i == 0 && host) f.self_host = t.unsafeGetTensorImpl();
            if (i + 1 == inputs.size() && !host) seen.last_device = true;
          }
        });
      }
      f.all_host = !seen.any_device;
      if ((info.flags & kRule) && recorded_depth_ == 0 && worth_asking(info.filter, seen)) {
        f.recorded = ask(info, inputs);
        if (f.recorded) ++recorded_depth_;
      }
    }
    stack_.push_back(f);
  }

  void end(const at::RecordFunction& fn) {
    if (stack_.empty()) return;  // installed while the op ran
    Frame f = stack_.back();
    stack_.pop_back();
    if (f.flags & kOpaque) --opaque_depth_;
    if (f.recorded) --recorded_depth_;
    if (!f.visible) return;
    const auto& outputs = fn.outputs();
    if (f.recorded && needs_grad(outputs)) recorded(outputs);
    if (f.flags & kKeep) return;
    if ((f.flags & kLift) || (f.all_host && !(device_default > 0 && !f.has_tensor))) {
      for (const auto& o : outputs) each_tensor(o, [&](const at::Tensor& t) { mark_host(t); });
    } else if (device_default > 0 && !f.has_tensor) {
      for (const auto& o : outputs) each_tensor(o, [&](const at::Tensor& t) { mark_device(t); });
    } else if (f.self_host != nullptr) {  // an in-place op on a host tensor with device inputs
      for (const auto& o : outputs) {
        each_tensor(o, [&](const at::Tensor& t) {
          if (t.unsafeGetTensorImpl() == f.self_host) mark_device(t);
        });
      }
    }
  }

  void reset_stack() {
    stack_.clear();
    opaque_depth_ = recorded_depth_ = 0;
  }

 private:
  OpInfo& info_of(const at::RecordFunction& fn) {
    auto key = std::make_pair(fn.name(), fn.overload_name());
    auto it = ops_.find(key);
    if (it != ops_.end()) return it->second;
    OpInfo info;
    std::string name = fn.name();
    std::string overload = fn.overload_name();
    auto op = c10::Dispatcher::singleton().findOp({name, overload});
    // Ranges that are no op (the autograd engine's, record_function's) enclose user code.
    bool decomposes = !op;
    if (op) {
      using K = c10::DispatchKey;
      decomposes = op->hasKernelForDispatchKey(K::CompositeImplicitAutograd);
      for (K k : {K::CPU, K::CUDA, K::CompositeExplicitAutograd,
                  K::CompositeExplicitAutogradNonFunctional, K::Autograd, K::AutogradCPU,
                  K::AutogradCUDA}) {
        if (op->hasKernelForDispatchKey(k)) decomposes = false;
      }
    }
    if (!decomposes) info.flags |= kOpaque;
    auto rule = rules_.find(name);
    if (rule != rules_.end()) {
      info.flags |= kRule;
      info.filter = rule->second;
      py::gil_scoped_acquire gil;
      info.name = py::str(name);
      info.overload = py::str(overload.empty() ? "default" : overload);
      if (op) {
        const auto& args = op->schema().arguments();
        for (size_t i = 0; i < args.size(); ++i) {
          if (args[i].kwarg_only()) info.kwonly.emplace_back(i, py::str(args[i].name()));
        }
      }
    }
    if (std::find(lifts_.begin(), lifts_.end(), name) != lifts_.end()) info.flags |= kLift;
    if (std::find(keeps_.begin(), keeps_.end(), name) != keeps_.end()) info.flags |= kKeep;
    return ops_.emplace(key, std::move(info)).first->second;
  }

  static bool worth_asking(uint8_t filter, const Inputs& seen) {
    switch (filter) {
      case kSparse: return seen.any_sparse && seen.any_device;
      case kLastDevice: return seen.last_device;
      case kCrossing: return seen.any_device && seen.any_host;
      default: return seen.any_device;
    }
  }

  bool ask(const OpInfo& info, c10::ArrayRef<const c10::IValue> inputs) {
    py::gil_scoped_acquire gil;
    try {
      py::list args;
      py::dict kwargs;
      size_t k = 0;
      for (size_t i = 0; i < inputs.size(); ++i) {
        py::object value = torch::jit::toPyObject(inputs[i]);
        if (k < info.kwonly.size() && info.kwonly[k].first == i) {
          kwargs[info.kwonly[k++].second] = value;
        } else {
          args.append(value);
        }
      }
      return on_rule_(info.name, info.overload, py::tuple(args), kwargs).cast<bool>();
    } catch (py::error_already_set& e) {
      unraisable(e, on_rule_);
      return false;
    }
  }

  static bool needs_grad(const std::vector<c10::IValue>& outputs) {
    bool any = false;
    for (const auto& o : outputs) {
      each_tensor(o, [&](const at::Tensor& t) { any = any || t.requires_grad(); });
    }
    return any;
  }

  // Python gets the outputs of an op it recorded that autograd will run backward through
  // (their node is set by now): a sync in that backward is shown at the forward line.
  void recorded(const std::vector<c10::IValue>& outputs) {
    py::gil_scoped_acquire gil;
    try {
      py::list values;
      for (const auto& o : outputs) values.append(torch::jit::toPyObject(o));
      on_recorded_(py::tuple(values));
    } catch (py::error_already_set& e) {
      unraisable(e, on_recorded_);
    }
  }

  // An exception cannot leave a RecordFunction callback: report it, and let Ctrl-C reach the
  // next Python bytecode.
  static void unraisable(py::error_already_set& e, const py::object& where) {
    bool interrupt = e.matches(PyExc_KeyboardInterrupt);
    e.restore();
    PyErr_WriteUnraisable(where.ptr());
    if (interrupt) PyErr_SetInterrupt();
  }

  void sweep() {
    for (auto it = host_.begin(); it != host_.end();) {
      it = it->second.expired() ? host_.erase(it) : std::next(it);
    }
    sweep_at_ = std::max<size_t>(4096, host_.size() * 2);
  }

  py::object on_rule_;
  py::object on_recorded_;
  std::unordered_map<Impl*, c10::weak_intrusive_ptr<Impl>> host_;
  size_t sweep_at_ = 4096;
  std::unordered_map<std::string, uint8_t> rules_;
  std::vector<std::string> lifts_;
  std::vector<std::string> keeps_;
  std::unordered_map<std::pair<const char*, const char*>, OpInfo, PtrPairHash> ops_;
  std::vector<Frame> stack_;
  int opaque_depth_ = 0;
  int recorded_depth_ = 0;
};

// Observers of this thread (sessions may nest); the callback is registered once per thread.
thread_local std::vector<Observer*> tls_observers;
thread_local at::CallbackHandle tls_handle = 0;

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  for (Observer* o : tls_observers) {
    if (!o->closed) o->start(fn);
  }
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  for (auto it = tls_observers.rbegin(); it != tls_observers.rend(); ++it) {
    if (!(*it)->closed) (*it)->end(fn);
  }
}

void install(Observer& o) {
  o.closed = false;
  o.reset_stack();
  tls_observers.push_back(&o);
  if (tls_handle == 0) {
    tls_handle = at::addThreadLocalCallback(
        at::RecordFunctionCallback(on_start, on_end)
            .needsInputs(true)
            .needsOutputs(true)
            .scopes({at::RecordScope::FUNCTION}));
  }
}

void uninstall(Observer& o) {
  o.closed = true;  // on another thread: it stays registered there, and does nothing
  auto it = std::find(tls_observers.begin(), tls_observers.end(), &o);
  if (it == tls_observers.end()) return;
  tls_observers.erase(it);
  if (tls_observers.empty() && tls_handle != 0) {
    at::removeCallback(tls_handle);
    tls_handle = 0;
  }
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
  py::class_<Observer>(m, "Observer")
      .def(py::init<py::object, py::object>(), py::arg("on_rule"), py::arg("on_recorded"))
      .def("is_host", &Observer::is_host)
      .def("mark_host", &Observer::mark_host)
      .def("mark_device", &Observer::mark_device)
      .def("add_rule", &Observer::add_rule)
      .def("add_lift", &Observer::add_lift)
      .def("add_keep", &Observer::add_keep)
      .def_readwrite("device_default", &Observer::device_default)
      .def("install", [](Observer& o) { install(o); })
      .def("uninstall", [](Observer& o) { uninstall(o); });
}
