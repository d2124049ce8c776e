"""The image classifiers of ryujaehun/pytorch-gpu-benchmark, written here from the published
architectures (the layer tables of the ResNet, VGG, MobileNetV2, SqueezeNet 1.1 and DenseNet
papers as torchvision builds them: the same modules, so the same ops reach the GPU, and parameter
counts equal to torchvision's; a ResNet block computes its shortcut before its main branch, where
torchvision computes it after), and the benchmark's timed loop as its README and
benchmark_models.py describe it.

The loop: batch 12 of 3x224x224 float32 images already on the host, `torch.cuda.synchronize()`,
`model.zero_grad()`, `model(img.to("cuda"))` (a pageable host-to-device copy inside the timed
region), cross-entropy against targets already on the device, `loss.backward()`,
`torch.cuda.synchronize()`.  No optimizer step.  The published figure is the mean of those
intervals over 50 iterations after 5 warm-up ones; a scan's step is one iteration.

torchvision is not a dependency of gpusync, hence the definitions here.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn as nn

dev = "cuda" if torch.cuda.is_available() else "cpu"
BATCH, CLASSES, SIDE = 12, 1000, 224


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout)]


class Basic(nn.Module):
    """ResNet-18/34's block: two 3x3 convolutions and the shortcut."""

    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int):
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(cin, planes, 3, stride)
        self.conv2, self.bn2 = _conv_bn(planes, planes, 3)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = (nn.Sequential(*_conv_bn(cin, planes, 1, stride))
                           if stride != 1 or cin != planes else None)

    def forward(self, x):
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += shortcut
        return self.relu(out)


class Bottleneck(nn.Module):
    """ResNet-50's block (v1.5: the stride on the 3x3 convolution), expansion 4."""

    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int):
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(cin, planes, 1)
        self.conv2, self.bn2 = _conv_bn(planes, planes, 3, stride)
        self.conv3, self.bn3 = _conv_bn(planes, planes * 4, 1)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = (nn.Sequential(*_conv_bn(cin, planes * 4, 1, stride))
                           if stride != 1 or cin != planes * 4 else None)

    def forward(self, x):
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += shortcut
        return self.relu(out)


class ResNet(nn.Module):
    def __init__(self, block: type[Basic] | type[Bottleneck], depths: list[int]):
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(3, 64, 7, 2)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages, cin = [], 64
        for i, (planes, depth) in enumerate(zip((64, 128, 256, 512), depths, strict=True)):
            blocks = []
            for j in range(depth):
                blocks.append(block(cin, planes, 2 if i > 0 and j == 0 else 1))
                cin = planes * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, CLASSES)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18() -> nn.Module:
    return ResNet(Basic, [2, 2, 2, 2])


def resnet50() -> nn.Module:
    return ResNet(Bottleneck, [3, 4, 6, 3])


class VGG16(nn.Module):
    """Configuration D: thirteen 3x3 convolutions with biases and ReLU, five max-pools, three
    fully connected layers with dropout."""

    def __init__(self):
        super().__init__()
        layers: list[nn.Module] = []
        cin = 3
        for width in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
                      512, 512, 512, "M"):
            if width == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(cin, int(width), 3, padding=1), nn.ReLU(inplace=True)]
                cin = int(width)
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(True), nn.Dropout(),
            nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(),
            nn.Linear(4096, CLASSES))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def _conv_bn_relu6(cin: int, cout: int, kernel: int, stride: int = 1,
                   groups: int = 1) -> nn.Sequential:
    return nn.Sequential(*_conv_bn(cin, cout, kernel, stride, groups), nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = [] if expand == 1 else [_conv_bn_relu6(cin, hidden, 1)]
        layers += [_conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),
                   *_conv_bn(hidden, cout, 1)]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.conv(x) if self.residual else self.conv(x)


class MobileNetV2(nn.Module):
    """Width 1.0: the paper's table 2 (expansion, channels, repeats, stride)."""

    def __init__(self):
        super().__init__()
        layers: list[nn.Module] = [_conv_bn_relu6(3, 32, 3, 2)]
        cin = 32
        for expand, cout, repeats, stride in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2),
                                              (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                                              (6, 320, 1, 1)):
            for i in range(repeats):
                layers.append(InvertedResidual(cin, cout, stride if i == 0 else 1, expand))
                cin = cout
        layers.append(_conv_bn_relu6(cin, 1280, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, CLASSES))

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(x.reshape(x.shape[0], -1))


class Fire(nn.Module):
    def __init__(self, cin: int, squeeze: int, expand1: int, expand3: int):
        super().__init__()
        self.squeeze = nn.Conv2d(cin, squeeze, 1)
        self.expand1x1 = nn.Conv2d(squeeze, expand1, 1)
        self.expand3x3 = nn.Conv2d(squeeze, expand3, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        x = self.relu(self.squeeze(x))
        return torch.cat([self.relu(self.expand1x1(x)), self.relu(self.expand3x3(x))], 1)


class SqueezeNet11(nn.Module):
    def __init__(self):
        super().__init__()
        pool = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 3, 2), nn.ReLU(inplace=True), pool,
            Fire(64, 16, 64, 64), Fire(128, 16, 64, 64), pool,
            Fire(128, 32, 128, 128), Fire(256, 32, 128, 128), pool,
            Fire(256, 48, 192, 192), Fire(384, 48, 192, 192),
            Fire(384, 64, 256, 256), Fire(512, 64, 256, 256))
        self.classifier = nn.Sequential(nn.Dropout(0.5), nn.Conv2d(512, CLASSES, 1),
                                        nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d((1, 1)))

    def forward(self, x):
        return torch.flatten(self.classifier(self.features(x)), 1)


class DenseLayer(nn.Module):
    """BN-ReLU-1x1 conv (4 x growth) - BN-ReLU-3x3 conv (growth) over the concatenation of
    every earlier feature map of its block."""

    def __init__(self, cin: int, growth: int = 32):
        super().__init__()
        self.norm1, self.relu1 = nn.BatchNorm2d(cin), nn.ReLU(inplace=True)
        self.conv1 = nn.Conv2d(cin, 4 * growth, 1, bias=False)
        self.norm2, self.relu2 = nn.BatchNorm2d(4 * growth), nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        x = self.conv1(self.relu1(self.norm1(torch.cat(features, 1))))
        return self.conv2(self.relu2(self.norm2(x)))


class DenseBlock(nn.ModuleDict):
    def __init__(self, layers: int, cin: int, growth: int = 32):
        super().__init__({f"denselayer{i + 1}": DenseLayer(cin + i * growth, growth)
                          for i in range(layers)})

    def forward(self, x):
        features = [x]
        for layer in self.values():
            features.append(layer(features))
        return torch.cat(features, 1)


class DenseNet121(nn.Module):
    """Growth 32, blocks of 6, 12, 24 and 16 layers, transitions halving the channels."""

    def __init__(self):
        super().__init__()
        layers: list[nn.Module] = [*_conv_bn(3, 64, 7, 2), nn.ReLU(inplace=True),
                                   nn.MaxPool2d(3, 2, 1)]
        channels = 64
        for i, depth in enumerate((6, 12, 24, 16)):
            layers.append(DenseBlock(depth, channels))
            channels += depth * 32
            if i < 3:
                layers += [nn.BatchNorm2d(channels), nn.ReLU(inplace=True),
                           nn.Conv2d(channels, channels // 2, 1, bias=False),
                           nn.AvgPool2d(2, 2)]
                channels //= 2
        layers.append(nn.BatchNorm2d(channels))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels, CLASSES)

    def forward(self, x):
        x = nn.functional.relu(self.features(x), inplace=True)
        x = nn.functional.adaptive_avg_pool2d(x, (1, 1))
        return self.classifier(torch.flatten(x, 1))


def _sync() -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


def train_like_the_benchmark(model: nn.Module) -> None:
    """The benchmark's timed loop; `--iters` iterations.  `--zero-grad zeros` is PyTorch < 2.0's
    `model.zero_grad()` (a zero_ kernel per parameter), `none` today's (grads set to None);
    `--tf32-matmul` is PyTorch 1.7-1.11's default for float32 matmuls on Ampere."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=4)
    parser.add_argument("--zero-grad", choices=("zeros", "none"), default="zeros")
    parser.add_argument("--tf32-matmul", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = args.tf32_matmul
    model = model.float().to(dev)
    criterion = nn.CrossEntropyLoss()
    target = torch.randint(0, CLASSES, (BATCH,)).to(dev)
    images = torch.randn(args.iters, BATCH, 3, SIDE, SIDE)
    for step in range(args.iters):
        _sync()
        model.zero_grad(set_to_none=args.zero_grad == "none")
        prediction = model(images[step].to(dev))
        loss = criterion(prediction, target)
        loss.backward()
        _sync()
