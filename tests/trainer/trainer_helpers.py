"""A tiny model, its optimizer and a few steps, for the trainer tests."""

from __future__ import annotations

import torch


def tiny_training(steps: int = 2, seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        optim.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()
        optim.step()
    return model, optim
