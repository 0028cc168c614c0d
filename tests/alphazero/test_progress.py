"""What an AlphaZero run carries between iterations: a snapshot is a copy later training leaves
alone, and a frozen opponent holds the snapshot's weights in eval mode."""

import torch

from lmselfplay.alphazero.network import PolicyValueNet
from lmselfplay.alphazero.progress import frozen, snapshot


def test_a_snapshot_is_a_copy_and_a_frozen_opponent_holds_it():
    torch.manual_seed(0)
    net = PolicyValueNet(10, 3, hidden=8, blocks=1).train()
    kept = snapshot(net)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)  # training after the snapshot
    assert all(not torch.equal(kept[k], v) for k, v in net.state_dict().items() if v.is_floating_point())
    opponent = frozen(net, kept)
    assert not opponent.training and net.training
    assert all(torch.equal(opponent.state_dict()[k], v) for k, v in kept.items())
    assert opponent is not net
