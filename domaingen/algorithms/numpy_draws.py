"""An algorithm-owned numpy random stream, for methods whose reference code draws from numpy.

DomainBed's SelfReg and CausIRL draw a mixing weight or a split point with numpy's
global functions (`np.random.beta`, `np.random.randint`). A run here seeds only
torch and checkpoints only torch's generator, so such draws come from a
`np.random.RandomState` that the algorithm owns instead: the same MT19937
generator as numpy's global functions (seeding both alike gives the same draws),
seeded from torch's generator when the algorithm is built, and saved and restored
with the algorithm's checkpoints, so that a resumed run draws what an
uninterrupted one does.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch


class NumpyDraws:
    """Mixin: `self.numpy_rng`, a RandomState kept in `checkpoint_state`.

    Call `init_numpy_draws()` once the algorithm's modules are built (it takes one
    number from torch's generator).
    """

    numpy_rng: np.random.RandomState

    def init_numpy_draws(self) -> None:
        self.numpy_rng = np.random.RandomState(int(torch.randint(2**31 - 1, ()).item()))

    def checkpoint_state(self) -> dict[str, Any]:
        state = super().checkpoint_state()  # type: ignore[misc]
        raw = self.numpy_rng.get_state(legacy=False)
        # tensors and plain numbers only: loadable by torch.load(weights_only=True)
        state["numpy_rng"] = {
            "key": torch.from_numpy(raw["state"]["key"].astype(np.int64)),
            "pos": int(raw["state"]["pos"]),
            "has_gauss": int(raw["has_gauss"]),
            "gauss": float(raw["gauss"]),
        }
        return state

    def load_checkpoint_state(self, state: Mapping[str, Any]) -> None:
        super().load_checkpoint_state(state)  # type: ignore[misc]
        saved = state.get("numpy_rng")
        if saved is not None:
            self.numpy_rng.set_state({
                "bit_generator": "MT19937",
                "state": {"key": saved["key"].numpy().astype(np.uint32), "pos": int(saved["pos"])},
                "has_gauss": int(saved["has_gauss"]),
                "gauss": float(saved["gauss"]),
            })
