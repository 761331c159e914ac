"""``python -m kubelet_dra``: the same as the ``kubelet-dra-health`` command."""

from kubelet_dra import cli

raise SystemExit(cli.main())
