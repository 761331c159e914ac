"""Interop tests against real Go components (kubeletplugin helpers, kube-apiserver)."""
