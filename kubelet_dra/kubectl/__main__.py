"""``python -m kubelet_dra.kubectl``: the same as ``kubectl-dra_health``."""

from kubelet_dra.kubectl._cli import entry_point

entry_point()
