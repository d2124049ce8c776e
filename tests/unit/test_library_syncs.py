"""Known library syncs (detect/libraries/, rules.py's kb block): a scan reports each at the
user's line, with the library line beneath and the library's own remedy; the same call
with the remedy applied, or a sync only the CPU kernel makes, is not reported."""
import json
import os
import textwrap

import pytest
import torch

import gpusync
from gpusync.detect.events import Frame
from gpusync.detect.libraries import ENTRIES, FRAMEWORKS, library_advice
from gpusync.detect.rules import ADVICE, DISPATCH_RULES, NAMED_RULES, QUIET
from tests.conftest import run_main

pytestmark = pytest.mark.usefixtures("in_process")

TORCH_SCRIPT = textwrap.dedent("""\
    import torch
    dev = torch.device("cuda")
    x = torch.rand(8, device=dev) + 0.5
    layer = torch.nn.TransformerEncoderLayer(4, 2, dim_feedforward=8, batch_first=True)
    enc = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False).to(dev)
    lin = torch.nn.Linear(4, 1).to(dev)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(3, device=dev)
    idx, ones = torch.arange(2, device=dev).view(1, 2), torch.ones(2, device=dev)
    logp = torch.randn(5, 2, 3, device=dev).log_softmax(2)
    tgt = torch.ones(2, 2, dtype=torch.long, device=dev)
    lens_dev, tlens_dev = torch.full((2,), 5, device=dev), torch.full((2,), 2, device=dev)
    big = torch.arange(100, device=dev)
    for step in range(3):
        d = torch.distributions.Normal(x, x)  # L15
        d2 = torch.distributions.Normal(x, x, validate_args=False)
        y = enc(torch.randn(2, 3, 4, device=dev), mask=mask)  # L17
        y2 = enc(torch.randn(2, 3, 4, device=dev), mask=mask, is_causal=True)
        loss = lin(torch.randn(2, 4, device=dev)).pow(2).mean()
        loss.backward()
        opt.step()
        sched.step(loss)  # L23
        sp = torch.sparse_coo_tensor(idx, ones)  # L24
        sp2 = torch.sparse_coo_tensor(idx, ones, size=(4,))
        c = torch.nn.functional.ctc_loss(logp, tgt, lens_dev, tlens_dev)  # L26
        c2 = torch.nn.functional.ctc_loss(logp, tgt, [5, 5], [2, 2])  # L27
        q = torch.quantile(x, torch.linspace(0, 1, 3, device=dev))
        q2 = torch.nanquantile(x, 0.5)
        i = torch.isin(torch.arange(10, device=dev), big)  # L30
        i2 = torch.isin(torch.arange(10, device=dev), big, assume_unique=True)
        i3 = torch.isin(torch.arange(10, device=dev), big[:3])
""")


def scan_sites(tmp_path, script):
    """Measured sites, less `torch.tensor(data, device=)` on the scripts' own lines."""
    (tmp_path / "train.py").write_text(script)
    proc = run_main("scan", "train.py", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["error"] is None
    return [s for s in report["sites"] if not s["setup"] and (
        "torch.tensor" not in s["op"] or s["frames"][0]["library"])]


def by_line(sites):
    out = {}
    for s in sites:
        beneath = next((f["function"] for f in s["frames"] if f["library"]), None)
        out.setdefault(s["line"], []).append((s["op"], beneath, s["fix"]))
    return out


def test_torch_library_syncs_get_their_remedy_and_remedied_calls_are_quiet(tmp_path, in_child):
    """In a child: torch.compile's first use (here, by other tests) turns torch.distributions'
    validation off for the process's life (torch/_dynamo/eval_frame.py), a fresh one has it."""
    lines = by_line(scan_sites(tmp_path, TORCH_SCRIPT))
    expect = {
        16: ("bool()", "Distribution.__init__", "validate_args=False"),
        18: ("bool()", "_detect_is_causal_mask", "is_causal=True"),
        23: ("float()", "ReduceLROnPlateau.step", "host float"),
        24: ("sparse_coo_tensor size", None, ADVICE["sparse_coo_tensor size"]),
        26: ("ctc_loss lengths", None, ADVICE["ctc_loss lengths"]),
        27: ("ctc_loss (CUDA kernel)", None, ADVICE["ctc_loss (CUDA kernel)"]),
        30: ("isin", None, ADVICE["isin"]),
    }
    assert sorted(lines) == sorted(expect), lines  # the remedied lines and quantile: nothing
    for line, (op, beneath, fix) in expect.items():
        # device lengths: read on the host, then the kernel's own copies up
        also = [("ctc_loss (CUDA kernel)", None)] if line == 26 else []
        assert sorted((o, b or "") for o, b, _ in lines[line]) == sorted(
            (o, b or "") for o, b in [(op, beneath), *also]), lines[line]
        assert fix in next(f for o, _, f in lines[line] if o == op)


NESTED_SCRIPT = textwrap.dedent("""\
    import torch
    dev = torch.device("cuda")
    layer = torch.nn.TransformerEncoderLayer(4, 2, dim_feedforward=8, batch_first=True)
    enc = torch.nn.TransformerEncoder(layer, 2).to(dev).eval()
    dense = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).to(dev).eval()
    pad = torch.tensor([[False, False, True], [False, False, False]], device=dev)
    with torch.no_grad():
        for step in range(3):
            src = torch.randn(2, 3, 4, device=dev)
            y = enc(src, src_key_padding_mask=pad)  # L10
            y2 = dense(src, src_key_padding_mask=pad)
""")


def test_transformer_encoder_nested_fast_path_reads_the_mask(tmp_path):
    lines = by_line(scan_sites(tmp_path, NESTED_SCRIPT))
    assert list(lines) == [10]
    # the alignment check (equal) and the lengths copied to the host: two reads
    assert [(op, beneath) for op, beneath, _ in lines[10]] == [
        ("nested tensor from mask", "TransformerEncoder.forward")] * 2
    assert all("enable_nested_tensor=False" in fix for _, _, fix in lines[10])


def dev_tensors():
    return torch.arange(10), torch.arange(100)  # made before the block: on the device


@pytest.mark.parametrize("case", ["sorting", "assume_unique", "brute force"])
def test_isin_syncs_only_on_its_sorting_path_without_assume_unique(case, observer):
    small, big = dev_tensors()
    with gpusync.watch(mode="simulate") as w:
        if case == "sorting":
            torch.isin(small, big)
        elif case == "assume_unique":
            torch.isin(small, big, assume_unique=True)
        else:
            torch.isin(small, big[:3])
    assert [s.op for s in w.report().sites] == (["isin"] if case == "sorting" else [])


def test_quantile_range_check_is_cpu_only(observer):
    x, q = torch.rand(8), torch.tensor([0.25, 0.75])
    with gpusync.watch(mode="simulate") as w:
        torch.quantile(x, q), torch.nanquantile(x, 0.5), torch.quantile(x, 0.1, dim=0)
    assert w.report().sites == ()


FBGEMM_SCRIPT = textwrap.dedent("""\
    import torch
    import fbgemm_gpu  # noqa: F401
    dev = torch.device("cuda")
    lengths, values = torch.tensor([1, 2, 0, 3], device=dev), torch.arange(6, device=dev)
    p1 = torch.tensor([3, 2, 1, 0], device=dev, dtype=torch.int32)
    p2 = torch.tensor([1, 0], device=dev, dtype=torch.int32)
    dense, offs = torch.randn(2, 3, 4, device=dev), torch.tensor([0, 2, 5], device=dev)
    rows, sel = torch.randn(6, 4, device=dev), torch.tensor([0, 3], device=dev)
    fb = torch.ops.fbgemm
    for step in range(3):
        a = fb.permute_1D_sparse_data(p1, lengths, values)  # L11
        b = fb.permute_1D_sparse_data(p1, lengths, values, None, 6)
        c = fb.permute_2D_sparse_data(p2, lengths.view(2, 2), values)  # L13
        d = fb.permute_2D_sparse_data(p2, lengths.view(2, 2), values, None, 6)
        e = fb.dense_to_jagged(dense, [offs])  # L14
        f = fb.dense_to_jagged(dense, [offs], 5)
        g = fb.jagged_index_select(rows, lengths, sel)  # L16
        h = fb.jagged_index_select(rows, lengths, sel, 4)
""")


@pytest.mark.torchrec
def test_fbgemm_ops_sync_without_their_size_argument(tmp_path, observer):
    pytest.importorskip("fbgemm_gpu")
    lines = by_line(scan_sites(tmp_path, FBGEMM_SCRIPT))
    expect = {11: "fbgemm permute", 13: "fbgemm permute", 15: "fbgemm dense_to_jagged",
              17: "fbgemm jagged_index_select"}
    assert {line: [o for o, _, _ in v] for line, v in lines.items()} == {
        line: [op] for line, op in expect.items()}
    assert all(v[0][2] == ADVICE[v[0][0]] for v in lines.values())
    # called directly: no library path beneath (torch.library's autograd glue is plumbing)
    assert all(beneath is None for v in lines.values() for _, beneath, _ in v)


KJT_SCRIPT = textwrap.dedent("""\
    import torch
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
    dev = torch.device("cuda")
    cfg = EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=10, feature_names=["a", "b"])
    ebc = EmbeddingBagCollection(tables=[cfg], device=dev)
    order = torch.tensor([1, 0], dtype=torch.int, device=dev)
    def batch(**host):
        return KeyedJaggedTensor(keys=["a", "b"], values=torch.tensor([1, 2, 3, 4], device=dev),
                                 lengths=torch.tensor([1, 1, 2, 0], device=dev), **host)
    for step in range(3):
        ebc(batch())  # L13
        batch().to_dict()  # L14
        batch().split([1, 1])  # L15
        batch().permute([1, 0], order)  # L16
        batch().permute([1, 0], order).permute([1, 0])  # L17
        kjt = batch(length_per_key=[2, 2])
        ebc(kjt), kjt.to_dict(), kjt.split([1, 1]), kjt.permute([1, 0], order)
""")


@pytest.mark.torchrec
def test_kjt_per_key_lengths_get_the_construct_with_length_per_key_remedy(tmp_path):
    pytest.importorskip("torchrec")
    lines = by_line(scan_sites(tmp_path, KJT_SCRIPT))
    assert sorted(lines) == [13, 14, 15, 16, 17], lines  # length_per_key given: nothing
    kjt_advice = next(e.advice for e in ENTRIES if "_maybe_compute_length_per_key" in e.functions)
    permute_advice = next(e.advice for e in ENTRIES
                          if e.functions == ("KeyedJaggedTensor.permute",))
    for line in (13, 14, 15, 16):
        assert {fix for _, _, fix in lines[line]} == {kjt_advice}, lines[line]
    # a permute without indices_tensor also copies its indices up
    assert {fix for _, _, fix in lines[17]} == {kjt_advice, permute_advice}


A2A_SCRIPT = textwrap.dedent("""\
    import os
    import tempfile
    import torch
    import torch.distributed as dist
    from torchrec.distributed.dist_data import JaggedTensorAllToAll
    from torchrec.sparse.jagged_tensor import JaggedTensor
    store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    dev = torch.device("cuda")
    for step in range(3):
        lengths = torch.tensor([2, 3], device=dev)
        jt, n = JaggedTensor(values=torch.arange(5, device=dev), lengths=lengths), lengths[:1]
        out = JaggedTensorAllToAll(jt, n, n, dist.group.WORLD).wait()  # L13
    dist.destroy_process_group()
""")


@pytest.mark.torchrec
def test_jagged_tensor_all_to_all_gets_the_pool_remedy_not_the_input_dist_one(tmp_path):
    pytest.importorskip("torchrec")
    lines = by_line(scan_sites(tmp_path, A2A_SCRIPT))
    assert list(lines) == [13]
    # sum(num_items) read as a size, and _safe_tolist's copy and stream sync
    assert sorted(op for op, _, _ in lines[13]) == [
        "Stream.synchronize", "item", "pageable non_blocking copy"]
    assert all("KeyedJaggedTensorPool" in fix for _, _, fix in lines[13])


SITE = "/venv/lib/python3.11/site-packages/"
USER = Frame("/home/u/train.py", 7, "step")


def lib(path, function):
    return Frame(SITE + path, 1, function, True)


def test_kjt_inside_input_dist_keeps_the_input_dist_remedy():
    inner = (lib("torchrec/sparse/jagged_tensor.py", "_safe_tolist"),
             lib("torchrec/sparse/jagged_tensor.py", "_maybe_compute_length_per_key"),
             lib("torchrec/sparse/jagged_tensor.py", "KeyedJaggedTensor.length_per_key"))
    alone = library_advice(inner + (USER,))
    assert alone is not None and "length_per_key=" in alone
    sharded = library_advice(inner + (lib("torchrec/distributed/embeddingbag.py",
                                       "ShardedEmbeddingBagCollection.input_dist"), USER))
    assert sharded is not None and "train pipeline" in sharded


@pytest.mark.parametrize("path, function, phrase", [
    ("torchrec/distributed/dist_data.py", "JaggedTensorAllToAll.__init__",
     "KeyedJaggedTensorPool"),
    ("torchrec/distributed/dist_data.py", "TensorAllToAllValuesAwaitable.__init__",
     "TensorPool"),
    ("torchrec/distributed/embedding_sharding.py", "FusedKJTListSplitsAwaitable.__init__",
     "TORCHREC_OVERFLOW_DEBUG"),
    ("torchrec/distributed/embedding.py",
     "ShardedEmbeddingCollection._compute_sequence_vbe_context", "inverse_indices"),
    ("fbgemm_gpu/split_table_batched_embeddings_ops_training.py",
     "SplitTableBatchedEmbeddingBagsCodegen._generate_vbe_metadata", "feature_dims"),
    ("fbgemm_gpu/tbe/ssd/training.py", "SSDTableBatchedEmbeddingBags._prefetch",
     "enrichment"),
])
def test_torchrec_and_fbgemm_entries_win_over_the_input_dist_one(path, function, phrase):
    # innermost: torchrec's _safe_tolist; outermost: the pipeline's data-dist stage
    frames = (lib("torchrec/sparse/jagged_tensor.py", "_safe_tolist"), lib(path, function),
              lib("torchrec/distributed/train_pipeline/utils.py", "_start_data_dist"), USER)
    fix = library_advice(frames)
    assert fix is not None and phrase in fix


def test_tbe_iteration_counter_entry_needs_its_line():
    pytest.importorskip("fbgemm_gpu")
    import fbgemm_gpu.split_table_batched_embeddings_ops_training as tbe

    src = open(tbe.__file__).read().splitlines()
    at = next(i for i, s in enumerate(src, 1) if "self.iter.cpu().item()" in s)
    fwd = "SplitTableBatchedEmbeddingBagsCodegen.forward"
    assert "iter_cpu" in library_advice((Frame(tbe.__file__, at, fwd, True), USER))
    assert library_advice((Frame(tbe.__file__, 1, fwd, True), USER)) is None  # another line


def test_every_entry_names_a_function_its_installed_library_has():
    import importlib.util

    for entry in ENTRIES + FRAMEWORKS:
        top = entry.path.split("/")[0]
        spec = importlib.util.find_spec(top)
        if spec is None or spec.origin is None:
            continue  # that library is not installed here
        base = os.path.dirname(os.path.dirname(spec.origin))
        target = os.path.join(base, entry.path)
        files = ([os.path.join(d, f) for d, _, fs in os.walk(target) for f in fs
                  if f.endswith(".py")] if os.path.isdir(target) else [target])
        text = "".join(open(f).read() for f in files)
        for function in entry.functions:
            name = function.rstrip(".").split(".")[-1]
            assert f"def {name}(" in text or f"class {name}(" in text, (entry.source, name)
        assert not entry.text or any(t in text for t in entry.text), (entry.source, entry.text)


ON = lambda t: isinstance(t, torch.Tensor)  # noqa: E731  everything on the device
aten = torch.ops.aten


def test_size_arguments_decide_the_fbgemm_rules():
    perm, lengths, values = torch.tensor([1, 0]), torch.tensor([1, 2]), torch.arange(3)
    permute = NAMED_RULES["fbgemm::permute_1D_sparse_data"]
    assert permute((perm, lengths, values), {}, ON) == "fbgemm permute"
    assert permute((perm, lengths, values, None, 3), {}, ON) == QUIET  # given: no read
    assert permute((perm, lengths, values), {"permuted_lengths_sum": 3}, ON) == QUIET
    assert permute((perm, lengths, values), {}, lambda t: False) is None  # all on the host
    select = NAMED_RULES["fbgemm::jagged_index_select_2d_forward_v2"]
    offsets = torch.tensor([1, 3])
    assert select((values, perm, offsets, offsets), {}, ON) == "fbgemm jagged_index_select"
    assert select((values, perm, offsets, offsets, 3), {}, ON) == QUIET


def test_ctc_loss_rule_by_where_the_lengths_are():
    """LossCTC.cpp / LossCTC.cu: each device length read on the host; unless cuDNN takes the
    call, host targets copied up and the kernel's three copies up; with the default mean
    reduction one more (the clamped target lengths)."""
    ctc = DISPATCH_RULES[aten.ctc_loss]
    logp, tgt, lens = torch.zeros(5, 2, 3), torch.ones(2, 2), torch.tensor([5, 5])

    def said(labels):
        return None if labels is None else [(str(one), one.times) for one in labels]

    assert said(ctc((logp, tgt, lens, lens), {}, ON, "Tensor")) == [
        ("ctc_loss lengths", 2), ("ctc_loss (CUDA kernel)", 4)]
    on_dev = lambda t: t is logp or t is tgt  # noqa: E731  host lengths
    assert said(ctc((logp, tgt, lens, lens), {}, on_dev, "Tensor")) == [
        ("ctc_loss (CUDA kernel)", 4)]
    logp_only = lambda t: t is logp  # noqa: E731  host targets too: copied up
    assert said(ctc((logp, tgt, [5, 5], [2, 2], 0, 2), {}, logp_only, "IntList")) == [
        ("ctc_loss (CUDA kernel)", 4)]  # reduction="sum": no clamped lengths
    assert ctc((logp, tgt, lens, lens), {}, lambda t: False, "Tensor") is None
    # cuDNN's conditions (int32 1-D host targets, full-length inputs): the mean's copy only
    flat = torch.ones(4, dtype=torch.int32)
    assert said(ctc((logp, flat, [5, 5], [2, 2]), {}, logp_only, "IntList")) == [
        ("ctc_loss (CUDA kernel)", 1)]
    assert said(ctc((logp, flat, [5, 4], [2, 2]), {}, logp_only, "IntList")) == [
        ("ctc_loss (CUDA kernel)", 5)]  # an input shorter than log_probs: the native kernel


def test_ctc_loss_backward_copies_up_three_times():
    back = DISPATCH_RULES[aten._ctc_loss_backward]
    grad, logp, tgt = torch.ones(2), torch.zeros(5, 2, 3), torch.ones(2, 2, dtype=torch.long)
    call = (grad, logp, tgt, [5, 5], [2, 2], torch.zeros(2), torch.zeros(2, 5, 5), 0)
    assert back(call, {}, ON, "").times == 3
    flat = torch.ones(4, dtype=torch.long)  # host flat targets, full lengths: maybe cuDNN's
    logp_only = lambda t: t is logp  # noqa: E731
    assert back((grad, logp, flat, *call[3:]), {}, logp_only, "") is None
    assert back(call, {}, lambda t: False, "") is None


def test_sparse_coo_tensor_rule_needs_the_size_free_overload():
    coo = DISPATCH_RULES[aten.sparse_coo_tensor]
    idx, vals = torch.tensor([[0, 1]]), torch.ones(2)
    assert coo((idx, vals), {}, ON, "indices") == "sparse_coo_tensor size"
    assert coo((idx, vals, [4]), {}, ON, "indices_size") is None
    assert coo((torch.zeros(1, 0, dtype=torch.long), torch.ones(0)), {}, ON, "indices") is None


def test_every_new_label_has_its_fix():
    labels = {"isin", "ctc_loss lengths", "ctc_loss (CUDA kernel)", "sparse_coo_tensor size",
              "nested tensor from mask", "fbgemm permute", "fbgemm dense_to_jagged",
              "fbgemm jagged_index_select"}
    assert labels <= set(ADVICE)


def test_ctc_loss_backward_copies_are_shown_at_the_loss_line():
    """Its kernel's node (CtcLossBackward0) lies under the mean's, the node the loss's line is
    kept on: the nodes an op made inside carry its line too (autograd's sequence numbers
    from the op's start), so the backward's copies are shown where the loss was computed.
    With the compiled observer: the dispatch mode sees ctc_loss's parts, not ctc_loss."""
    import sys

    from gpusync.detect.session import Session

    ctc, lengths = torch.nn.functional.ctc_loss, ([12, 12, 10], [4, 3, 4])
    with Session(mode="simulate", virtual_cuda=True) as s:
        logp = torch.randn(12, 3, 5, device="cuda", requires_grad=True)
        tgt = torch.randint(1, 5, (3, 4), device="cuda")
        loss, line = ctc(logp.log_softmax(2), tgt, *lengths), sys._getframe().f_lineno
        loss.backward()
    where = {(e.phase, e.location.line) for e in s.events if e.op == "ctc_loss (CUDA kernel)"}
    assert where == {("other", line), ("backward", line)}
