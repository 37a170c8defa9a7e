"""Re-create the demo assets in resources/demo: the digits data split and the trained DigitsCNN.

    pip install scikit-learn && python scripts/make_demo_assets.py

Uses scikit-learn's bundled 8x8 digits (no download). Deterministic: same seed, same split, same
training order; the weights may still differ in the last bits between CPUs or torch versions.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.sources import demo  # noqa: E402

SEED = 20261121
TEST_FRACTION = 0.3
EPOCHS = 40


def make_split() -> None:
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = digits.images.astype(np.uint8)  # values 0..16
    labels = digits.target.astype(np.uint8)
    order = np.random.default_rng(SEED).permutation(len(labels))
    cut = int(len(labels) * (1 - TEST_FRACTION))
    train, test = order[:cut], order[cut:]
    demo.DEMO_DIR.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(demo.DIGITS_DATA, train_images=images[train], train_labels=labels[train],
                        test_images=images[test], test_labels=labels[test])
    print(f"wrote {demo.DIGITS_DATA}: {len(train)} train, {len(test)} test")


def train() -> None:
    from safetensors.torch import save_file

    torch.manual_seed(SEED)
    train_split = demo.load_digits_split("train")
    test_split = demo.load_digits_split("test")
    model = demo.DigitsCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, EPOCHS)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(SEED)
    for epoch in range(EPOCHS):
        model.train()
        order = torch.randperm(len(train_split.labels), generator=generator)
        for start in range(0, len(order), 64):
            index = order[start:start + 64]
            images = train_split.images[index]
            # light augmentation: one-pixel shifts, so the net does not memorise positions
            images = torch.roll(images, shifts=tuple(torch.randint(-1, 2, (2,), generator=generator).tolist()),
                                dims=(2, 3))
            optimizer.zero_grad()
            loss = loss_fn(model(images), train_split.labels[index])
            loss.backward()
            optimizer.step()
        schedule.step()
        if epoch % 10 == 9:
            print(f"epoch {epoch + 1}: loss {loss.item():.3f}, test accuracy {demo.accuracy(model, test_split):.4f}")
    model.eval()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(demo.DIGITS_WEIGHTS))
    print(f"wrote {demo.DIGITS_WEIGHTS}: test accuracy {demo.accuracy(model, test_split):.4f}")


if __name__ == "__main__":
    make_split()
    train()
