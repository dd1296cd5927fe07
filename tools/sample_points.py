"""Write model/queueing/sample_points.npz: the model's fixed Sobol' points, made with scipy.stats
(model.queueing.sample_points.sobol_points) so a fresh process need not import it.
Run: python -m tools.sample_points (after a change of the points' seed, count or dimensions)."""

from __future__ import annotations

import numpy as np

from model.queueing.sample_points import SHIPPED_DIMS, SHIPPED_POINTS, sobol_points


def main() -> None:
    points = {f"d{dims}": sobol_points(dims) for dims in SHIPPED_DIMS}
    np.savez(SHIPPED_POINTS, **points)  # type: ignore[arg-type]  # numpy's stubs: allow_pickle
    print(f"wrote {SHIPPED_POINTS.name}: dims {', '.join(map(str, SHIPPED_DIMS))}")


if __name__ == "__main__":
    main()
