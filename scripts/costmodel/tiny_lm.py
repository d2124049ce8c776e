"""A small transformer language model (2 layers, width 128, 4 heads, context 64, batch 8,
vocabulary 512, AdamW) with a `.item()` of the loss every step: many small ops, host-bound on
any GPU.  Scanned by scripts/costmodel_load.py and scripts/costmodel_overhead.py.  With
TINY_LM_REFERENCE=1 the same model at width 8, context 4, batch 1, vocabulary 32: the same
modules and Python, kernels too small for a second CPU thread or a cold cache (the reference
for the Python a GPU host runs)."""
import os

import torch
import torch.nn as nn

dev = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
VOCAB, WIDTH, HEADS, LAYERS, CONTEXT, BATCH = (
    (32, 8, 4, 2, 4, 1) if os.environ.get("TINY_LM_REFERENCE") else (512, 128, 4, 2, 64, 8))
STEPS = int(os.environ.get("STEPS", "12"))  # scripts/costmodel_gpu.py times more


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Parameter(torch.zeros(CONTEXT, WIDTH))
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens):
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device)
        h = self.embed(tokens) + self.pos[: tokens.shape[1]]
        return self.head(self.blocks(h, mask=mask, is_causal=True))


model = LM().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.randint(0, VOCAB, (STEPS, BATCH, CONTEXT + 1))
for step in range(STEPS):
    batch = data[step].to(dev)
    logits = model(batch[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
