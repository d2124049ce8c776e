"""Data-dependent shapes, and the static-shape forms that do not sync."""
import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)


class Picker(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x, mask, counts):
        h = self.proj(x)
        picked = h[mask]  # expect: bool-mask index@forward, bool-mask write@backward
        kept = torch.where(mask.unsqueeze(1), h, torch.zeros_like(h))  # no sync
        idx = torch.arange(0, h.shape[0], 2, device=h.device)
        gathered = h[idx]  # integer gather: no sync
        rep = torch.repeat_interleave(counts)  # expect: repeat_interleave@forward
        rep2 = torch.repeat_interleave(counts, output_size=12)  # no sync
        return picked.sum() + kept.sum() + gathered.sum() + rep.sum() + rep2.sum()


model = Picker().to(device)  # expect: H2D copy@other
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x = torch.randn(8, 4, device=device)
    mask = x[:, 0] > 0
    counts = torch.full((4,), 3, device=device)
    loss = model(x, mask, counts)
    opt.zero_grad()
    loss.backward()
    opt.step()
    with torch.no_grad():
        y = x.clone()
        y[mask] = 0.0  # python scalar: masked_fill, no sync
        y[mask] = x[mask]  # expect: bool-mask index@other, bool-mask write@other
        sel = torch.masked_select(x, mask.unsqueeze(1))  # expect: masked_select@other
        nz = torch.nonzero(mask)  # expect: nonzero@other
        nzs = torch.nonzero_static(mask, size=8)  # no sync
        uniq = torch.unique(counts)  # expect: unique@other
        torch._assert_async(x.abs().sum() >= 0)  # no sync
        ones = torch.ones(3, device=device)
        keep = torch.tensor([True, False, True], device=device)  # expect: H2D copy (torch.tensor)@other
        ones[keep] = 2.0  # one-element host value: masked_fill, no sync
