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
                     "loss and each parameter's largest value (the largest parameter's for one "
                     "within that of zero); --rtol / --atol: a larger "
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


def test_a_tensor_at_zero_on_the_models_scale_is_judged_at_that_scale():
    """Attention's key bias (BERT under fused AdamW: tune refused the fused optimizer): its
    gradient is rounding noise, Adam divides it by its own size, and its values (1e-8) round
    apart by their whole size; at the model's scale (its largest parameter, 1.0) both are
    zero. A tensor of real size is still judged at its own scale."""
    weight, bias = torch.tensor([1.0, -0.5]), torch.tensor([1.7e-8, -0.9e-8])
    moved = [weight, torch.tensor([-0.6e-8, 2.3e-8])]
    assert parameters([weight, bias], moved, 2.4e-6, 0.0, scaled=True) is None
    assert parameters([weight, bias], [weight, torch.tensor([1.7e-8, 3e-6])], 2.4e-6, 0.0,
                      scaled=True).endswith("by up to 3.01e-06, 2.4e-06 allowed")
    small = torch.tensor([0.01, 0.02])  # real values: its own scale, 4.8e-08 allowed
    assert parameters([weight, small], [weight, small + 1e-7], 2.4e-6, 0.0,
                      scaled=True).endswith("4.8e-08 allowed")
    assert parameters([weight, bias], moved, 2.4e-6, 0.0) is not None  # unscaled: elementwise
