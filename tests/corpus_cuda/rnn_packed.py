# ruff: noqa: E501
"""A sequence classifier over variable-length sequences, as RNN scripts write it: the model is
wrapped in DataParallel whenever a GPU is there, the padded batch is packed around an LSTM
(pack_padded_sequence / pad_packed_sequence), and the lengths are brought back to the host
because DataParallel scattered them to the GPU."""
import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
B, T, E, H, C = 8, 12, 6, 16, 3


class Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(E, H, batch_first=True)
        self.out = torch.nn.Linear(H, C)

    def forward(self, x, lengths):
        # cuda: lengths.cpu() copies the scattered lengths back (PackedSequence.cpp checkLongTensor takes host lengths only); torch/nn/utils/rnn.py pack_padded_sequence: sorted_indices.to(input.device), a blocking copy up
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)  # expect: D2H copy@forward, H2D copy@forward
        out, _ = self.lstm(packed)  # no sync: batch_sizes is made on the host (PackedSequence.cpp _pack_padded_sequence) and read there
        # cuda: torch/nn/utils/rnn.py pad_packed_sequence: lengths[unsorted_indices.cpu()], a blocking copy back
        padded, _ = pad_packed_sequence(out, batch_first=True)  # expect: D2H copy@forward
        return self.out(padded.amax(1))


model = Classifier().to(device)  # expect: H2D copy@other
if torch.cuda.is_available():
    model = torch.nn.DataParallel(model)  # no sync: one device, already holding the parameters (data_parallel.py __init__: module.to(device_ids[0]))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    lengths = torch.randint(1, T + 1, (B,))
    x = torch.randn(B, T, E)
    y = torch.randint(0, C, (B,), device=device)
    # cuda: torch/csrc/cuda/comm.cpp scatter: chunk.to(cuda, non_blocking=true) of the pageable host x and lengths
    logits = model(x, lengths)  # expect: pageable non_blocking copy@forward
    loss = F.cross_entropy(logits, y)
    optimizer.zero_grad()
    loss.backward()  # no sync: the LSTM and the pack's backward read batch_sizes on the host
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")  # expect: item@other
