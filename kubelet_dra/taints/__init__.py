"""The taint bridge (opt-in; KEP-5055's "external health monitor"): the policy (pure), the
planner (rule names and objects, desired taints to operations; pure), the reconcile loop of
this node's DeviceTaintRules, and its state file. Its API calls are in ``kube/taintrules``."""
