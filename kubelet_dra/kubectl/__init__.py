"""``kubectl dra-health``: device health across a cluster, read from pods (a kubectl plugin).

The console script ``kubectl-dra_health`` is found by kubectl's plugin mechanism as
``kubectl dra-health``; it also runs alone and as ``python -m kubelet_dra.kubectl``. It only
reads: pods, the ResourceClaims it needs, DeviceTaintRules and the pod's Events. What it
reads is what ``podstatus.py`` (like the kubelet's ``UpdateAllocatedResourcesStatus``)
writes. Modules: ``_cli`` (commands, watch loop), ``_config`` (kubeconfig and in-cluster),
``_api`` (the GETs), ``_model`` (pure computation and the JSON schema), ``_render`` (output).
"""

from kubelet_dra.kubectl._cli import entry_point, main

__all__ = ["entry_point", "main"]
