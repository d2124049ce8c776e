"""MobileNetV2 (width 1.0) trained as ryujaehun/pytorch-gpu-benchmark times it:
batch 12, 3x224x224, float32,
zero_grad + forward + cross-entropy + backward, no optimizer step (convnets.py)."""
from convnets import MobileNetV2, train_like_the_benchmark

train_like_the_benchmark(MobileNetV2())
