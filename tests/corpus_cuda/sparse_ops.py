# ruff: noqa: E501, F841
"""Sparse and data-dependent ops as a graph-learning script writes them: a sparse adjacency
built from a sampled edge list each step (duplicate edges, so not coalesced), per-graph
context expanded to nodes with repeat_interleave, one-hot targets, a boolean mask over the
labelled nodes, and nonzero to find isolated nodes."""
import torch
import torch.nn.functional as F

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
N_NODES, N_GRAPHS, N_CLASSES, DIM, N_EDGES = 48, 4, 5, 16, 160


class NodeClassifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2 * DIM, N_CLASSES)

    def forward(self, agg, graph_ctx, graph_sizes):
        ctx = graph_ctx.repeat_interleave(graph_sizes, dim=0)  # expect: repeat_interleave@forward
        return self.lin(torch.cat([agg, ctx], 1))


model = NodeClassifier().to(device)  # expect: H2D copy@other
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
feats = torch.randn(N_NODES, DIM, device=device)
graph_sizes = torch.full((N_GRAPHS,), N_NODES // N_GRAPHS, device=device)
for step in range(4):
    edges = torch.randint(0, N_NODES, (2, N_EDGES), device=device)
    weights = torch.rand(N_EDGES, device=device)
    adj = torch.sparse_coo_tensor(edges, weights, (N_NODES, N_NODES), check_invariants=False)  # no sync: size given, invariants not checked, so no max/min of the indices is read
    # cuda: aten/src/ATen/native/sparse/cuda/SparseCUDATensorMath.cu s_addmm_out_sparse_dense_cuda: sparse_.coalesce() -> _coalesce_sparse_cuda reads newNnz on the host
    agg = torch.sparse.mm(adj, feats)  # expect: coalesce@other
    graph_ctx = torch.randn(N_GRAPHS, DIM, device=device)
    ctx_check = graph_ctx.repeat_interleave(graph_sizes, dim=0, output_size=N_NODES)  # no sync: output_size given, sum(repeats) is not read
    y = torch.randint(0, N_CLASSES, (N_NODES,), device=device)
    labelled = torch.rand(N_NODES, device=device) < 0.5
    logits = model(agg, graph_ctx, graph_sizes)
    target = F.one_hot(y, num_classes=N_CLASSES).float()  # no sync: with num_classes, Onehot.cpp one_hot skips its min()/max() .item() checks on CUDA (the CPU path runs them)
    per_node = F.cross_entropy(logits, target * 0.9 + 0.1 / N_CLASSES, reduction="none")
    loss = (per_node * labelled).sum() / labelled.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        acc = (logits.argmax(1)[labelled] == y[labelled]).float().mean()  # expect: bool-mask index@other
        # cuda: aten/src/ATen/native/Onehot.cpp one_hot: num_classes = self.max().item() + 1
        class_counts = F.one_hot(y).sum(0)  # expect: item@other
        deg = torch.zeros(N_NODES, device=device).index_add_(0, edges[1], torch.ones(N_EDGES, device=device))
        isolated = torch.nonzero(deg == 0).squeeze(1)  # expect: nonzero@other
    print(f"step {step} loss {loss.item():.4f} isolated {isolated.numel()}")  # expect: item@other
