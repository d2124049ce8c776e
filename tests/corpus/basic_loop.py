"""An ordinary loop: logging, host reads of device results, blocking batch copies."""
import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
model = model.to(device)  # expect: H2D copy@other
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
history = []
for step in range(4):
    x_host = torch.randn(32, 8)
    n_rows = int(x_host.shape[0])
    total = float(x_host.sum())  # host data: no sync
    x = x_host.to(device)  # expect: H2D copy@other
    y = torch.randn(32, 1).to(device)  # expect: H2D copy@other
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    history.append(loss.item())  # expect: item@other
    if torch.isnan(loss).any():  # expect: bool()@other
        break
    val = float(loss)  # expect: float()@other
    preds = model(x).detach()
    as_list = preds[:4].squeeze(1).tolist()  # expect: tolist@other
    on_host = preds.cpu()  # expect: D2H copy@other
    as_numpy = on_host.numpy()  # already on the host: no sync
    again = on_host.tolist()  # already on the host: no sync
