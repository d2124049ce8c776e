# ruff: noqa: E501
"""A two-layer GCN trained full-batch on one graph, pygcn-style: a normalised sparse
adjacency moved to the device once, `torch.spmm(adj, support)` in each GraphConvolution,
`torch.mm(adj, x)` and `adj @ x` between them, and the CUDA cache emptied after every epoch as some scripts do."""
import torch
import torch.nn.functional as F

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
N, F_IN, HID, C, N_EDGES = 64, 16, 32, 4, 256


class GraphConvolution(torch.nn.Module):
    def __init__(self, fin, fout):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(fin, fout) * 0.1)
        self.bias = torch.nn.Parameter(torch.zeros(fout))

    def forward(self, x, adj):
        support = torch.mm(x, self.weight)
        # cuda: backward runs adj.t().mm(grad) (FunctionsManual.cpp mm_mat2_backward); the transpose is uncoalesced (sparse_transpose_), so SparseCUDATensorMath.cu s_addmm_out_sparse_dense_cuda coalesces it and reads the new nnz on the host: once per layer per step
        output = torch.spmm(adj, support)  # expect: coalesce@backward
        return output + self.bias


class GCN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gc1 = GraphConvolution(F_IN, HID)
        self.gc2 = GraphConvolution(HID, C)

    def forward(self, x, adj):
        x = F.relu(self.gc1(x, adj))
        # cuda: torch.mm(sparse, dense) and `sparse @ dense` (torch.matmul -> mm) run the same backward as torch.spmm: adj.t() is uncoalesced, so s_addmm_out_sparse_dense_cuda coalesces it, once per line per step
        x = x + torch.mm(adj, x)  # expect: coalesce@backward
        x = x + adj @ x  # expect: coalesce@backward
        x = F.dropout(x, 0.5, self.training)
        return F.log_softmax(self.gc2(x, adj), dim=1)


edges = torch.randint(0, N, (2, N_EDGES))
adj = torch.sparse_coo_tensor(edges, torch.ones(N_EDGES), (N, N), check_invariants=False).coalesce()
adj = torch.sparse_coo_tensor(adj.indices(), adj.values() / adj.values().sum(), (N, N), check_invariants=False).coalesce()
features, labels = torch.randn(N, F_IN), torch.randint(0, C, (N,))
idx_train = torch.arange(0, N // 2)
model = GCN().to(device)  # expect: H2D copy@other
adj = adj.to(device)  # expect: H2D copy@other
features, labels, idx_train = features.to(device), labels.to(device), idx_train.to(device)  # expect: H2D copy@other
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
for epoch in range(4):
    model.train()
    optimizer.zero_grad()
    output = model(features, adj)  # no sync: adj is coalesced, so the forward spmm does not coalesce
    loss_train = F.nll_loss(output[idx_train], labels[idx_train])
    loss_train.backward()
    optimizer.step()
    if device.type == "cuda":
        # cuda: c10/cuda/CUDACachingAllocator.cpp emptyCache -> release_cached_blocks: cudaEventSynchronize on outstanding events, cudaFree (synchronizes the device)
        torch.cuda.empty_cache()  # expect: empty_cache@other
    print(f"epoch {epoch} loss {loss_train.item():.4f}")  # expect: item@other
