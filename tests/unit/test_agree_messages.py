"""Parity's rejection says by how much and by what tolerance it was judged, so a user can
choose --rtol / --atol (it named neither: 'final parameter 1 (50257, 256) differs')."""
import torch

from gpusync.runs.agree import Tolerance, differs, parameters


def test_a_parameter_that_differs_says_by_how_much_and_what_was_allowed():
    base = [torch.tensor([1.0, -2.0, 4.0])]
    other = [torch.tensor([1.0, -2.0, 4.0 + 2 ** -18])]
    assert parameters(base, other, 0.0, 0.0) == (
        "final parameter 1 (3,) differs from the original's by up to 3.81e-06")
    assert parameters(base, other, 1e-7, 0.0, scaled=True) == (
        "final parameter 1 (3,) differs from the original's by up to 3.81e-06, 4e-07 allowed")
    assert parameters(base, other, 1e-6, 0.0, scaled=True) is None  # 4e-06 allowed
    ints = [torch.tensor([1, 2])]
    assert parameters(ints, [torch.tensor([1, 3])], 0.0, 0.0) == (
        "final parameter 1 (2,) differs from the original's")


def test_a_rejection_names_the_tolerance_it_was_judged_by():
    record = {"losses": [1.0, 0.5], "steps": 2, "parameters": [torch.zeros(3)]}
    why = "final parameter 1 (3,) differs from the original's by up to 3.81e-06"
    fused = differs(why, Tolerance(rounding=True), record)
    assert fused == (f"differs from the original: {why} (judged within the float32 rounding of "
                     "a fused optimizer: 4 x 2 steps x eps 1.19e-07 = 9.5e-07 relative to each "
                     "loss and each parameter's largest value; --rtol / --atol: a larger "
                     "tolerance admits a change that only rounds differently)")
    assert differs(why, Tolerance(), record).endswith(
        "(judged identical; --rtol / --atol: a tolerance admits a change that only rounds "
        "differently)")


def test_a_rejection_names_the_parameter_as_its_model_does():
    """A BERT-like model's fused AdamW refusal named 'final parameter 37' only: the record
    keeps each optimizer parameter's name in its outermost module, taken when the optimizer
    is built."""
    from gpusync.runs.parity import Record, recording

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.key = torch.nn.Linear(2, 2)

    import weakref

    model = torch.nn.Sequential(Block(), torch.nn.Linear(2, 1))
    gone = weakref.proxy(Block())  # dead: isinstance() of it raises (a script failed so)
    record = Record()
    with recording(record):
        torch.optim.SGD(model.parameters(), lr=0.1)
    assert gone is not None
    names = record.parameter_names()
    assert names == ["0.key.weight", "0.key.bias", "1.weight", "1.bias"]
    base = [p.detach().clone() for p in model.parameters()]
    other = [t.clone() for t in base]
    other[1] += 1.0
    assert parameters(base, other, 0.0, 0.0, names=names).startswith(
        "final parameter 2 (0.key.bias) (2,) differs from the original's by up to 1")
