"""Data prepared on the host before it moves: reading it never syncs; reading it after the move
does. A DataLoader's batches live on the host."""
import torch
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pin = torch.cuda.is_available()
torch.manual_seed(0)
data = TensorDataset(torch.randint(1, 5, (64,)), torch.randn(64, 4))
loader = DataLoader(data, batch_size=16, pin_memory=pin)
emb = torch.nn.EmbeddingBag(100, 4, mode="sum").to(device)  # expect: H2D copy@other
opt = torch.optim.SGD(emb.parameters(), lr=0.1)


def to_device(t):
    return (t.pin_memory() if pin else t).to(device, non_blocking=True)


for lengths, dense in loader:
    sizes = lengths.tolist()  # host: no sync
    total = int(lengths.sum())  # host: no sync
    ids = torch.randint(0, 100, (total,))
    offsets = torch.zeros_like(lengths)
    offsets[1:] = torch.cumsum(lengths, 0)[:-1]
    ids, offsets, dense = (to_device(t) for t in (ids, offsets, dense))
    out = emb(ids, offsets) + dense
    loss = out.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    moved_sizes = offsets.tolist()  # expect: tolist@other
