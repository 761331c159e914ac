"""The mutation score per module of the core, read from mutmut's results.

``python -m tests.mutation.score --run`` runs mutmut over the modules named (all
of :data:`MODULES` by default) and prints the table; without ``--run`` it only
reads the results of the last run (``tox -e mutation`` is ``--run --fresh``).

mutmut mutates whole files; :data:`SCOPE` narrows two of them to the functions
the mutation run is about (the registration validation and the store's
encoding), and :data:`EQUIVALENT` lists the surviving mutants judged equivalent
(docs/testing.md gives each one's reason). The score of a module is
(killed + timed out) / (mutants in scope - equivalent): a mutant that makes its
tests run past the limit (an endless loop) is detected, as mutmut counts it.
``--survivors`` lists the rest, ``--patterns`` the globs ``mutmut run`` is given;
``--run --rerun-survivors`` tries only the rest again (after tests were added).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import pathlib
import shutil
import subprocess
import sys
from collections.abc import Iterable

MODULES = {
    "podstatus": "kubelet_dra/status/podstatus.py",
    "healthinfo": "kubelet_dra/state/healthinfo.py",
    "claims": "kubelet_dra/status/claims.py",
    "kube/patchplan": "kubelet_dra/kube/patchplan.py",
    "kube/podstate": "kubelet_dra/kube/podstate.py",
    "taintpolicy": "kubelet_dra/taints/policy.py",
    "taintplan": "kubelet_dra/taints/planner.py",
    "validation": "kubelet_dra/plugin/validation.py",
    "store": "kubelet_dra/state/store.py",
}

# Functions in scope per module, as mutmut names them (``x_<name>`` for a function,
# ``xǁ<Class>ǁ<method>`` for a method); ``*`` where the whole module is in scope.
SCOPE: dict[str, tuple[str, ...]] = {
    "validation": (
        "x_validate_driver_name",
        "x__go_lower",
        "x_validate_endpoint",
        "x__go_url_parse",
        "x__go_parse",
        "x__go_scheme",
        "x__go_unescape",
        "x_printable",
    ),
    "store": (
        "x__upsert",
        "xǁStoredDeviceǁto_record",
        "x__record_of",
        "x__value",
        "x__value_text",
        "x__parameters",
        "xǁHealthStoreǁ_load_chunks",
        "xǁHealthStoreǁ_load_rows",
    ),
}

# Surviving mutants judged equivalent (no test can tell them from the original):
# mutant name -> reason. docs/testing.md repeats them.
_CODEC = "Python's codec names are case-insensitive: 'UTF-8' is 'utf-8'"
_SHORTER = (
    "the path check refuses it anyway: with a host, query or fragment cut off, the "
    "parsed path is a decoded part of the endpoint, so shorter than it, never equal"
)
_SQL_CASE = "SQLite's keywords, identifiers and function names are case-insensitive"
EQUIVALENT: dict[str, str] = {
    "kubelet_dra.plugin.validation.x__go_lower__mutmut_6": (
        "lower-cases non-ASCII characters too: of all non-ASCII characters only the "
        "Kelvin sign lower-cases to ASCII, and it is in _GO_LOWER_TO_ASCII; every other "
        "stays non-ASCII and fails the subdomain pattern either way"
    ),
    "kubelet_dra.plugin.validation.x_validate_driver_name__mutmut_22": (
        "`> 253` to `>= 253`: unreachable, a name that got past the 63-byte check has at "
        "most 63 characters, and _go_lower maps one character to one"
    ),
    "kubelet_dra.plugin.validation.x_validate_endpoint__mutmut_28": _CODEC,
    "kubelet_dra.plugin.validation.x_printable__mutmut_7": _CODEC,
    "kubelet_dra.plugin.validation.x_printable__mutmut_11": _CODEC,
    "kubelet_dra.plugin.validation.x_validate_endpoint__mutmut_42": (
        "'unix:' to 'UNIX:': Go lower-cases the scheme, and the port keeps only whether "
        "there is one"
    ),
    "kubelet_dra.plugin.validation.x_validate_endpoint__mutmut_47": _SHORTER,
    "kubelet_dra.plugin.validation.x_validate_endpoint__mutmut_48": _SHORTER,
    "kubelet_dra.state.store.x__upsert__mutmut_7": _SQL_CASE,
    "kubelet_dra.state.store.x__upsert__mutmut_9": _SQL_CASE,
    "kubelet_dra.state.store.x__upsert__mutmut_10": _SQL_CASE,
    "kubelet_dra.state.store.x__value_text__mutmut_24": (
        "ensure_ascii=False to None: json.dumps only tests its truth, and None is false"
    ),
    "kubelet_dra.state.store.xǁHealthStoreǁ_load_chunks__mutmut_24": (
        "`row[0] or b''` to `or b'XXXX'`: unreachable, row[0] is NULL only for a chunk "
        "whose values are all NULL, and then the count of JSON values (json_valid(NULL) is "
        "0) is not the row count, so the check before raises"
    ),
    "kubelet_dra.state.store.xǁHealthStoreǁ_load_chunks__mutmut_26": (
        "`len(stored) != row[2]` to `!= row[3]`: the check before raised unless row[3] == row[2]"
    ),
    **dict.fromkeys(
        (f"kubelet_dra.state.healthinfo.xǁHealthCacheǁload__mutmut_{n}" for n in (16, 17, 20)),
        "the check for a key already scheduled (dropped, or `<` made `<=`): the store yields "
        "each key once and load() runs once, on an empty cache; loaded twice, the heap keeps "
        "either the exact deadline or an earlier one, both what next_deadline() promises",
    ),
    **dict.fromkeys(
        (f"kubelet_dra.state.healthinfo.xǁHealthCacheǁ_delete_where__mutmut_{n}" for n in (19, 20)),
        "a deleted device left in its driver's overdue set: the set is consumed whole at "
        "the driver's next report, where the device is absent or re-created by that very "
        "report, which carries it, so it is skipped either way",
    ),
    **dict.fromkeys(
        (f"kubelet_dra.state.healthinfo.xǁHealthCacheǁ_set__mutmut_{n}" for n in (3, 5)),
        "the default of setdefault: _set replaces an expired record, so its driver is there",
    ),
    **dict.fromkeys(
        (f"kubelet_dra.state.healthinfo.x_truncate_message__mutmut_{n}" for n in (4, 9, 13)),
        _CODEC + " (and decode's default codec is UTF-8)",
    ),
    **dict.fromkeys(
        (f"kubelet_dra.state.healthinfo.xǁHealthCacheǁ_schedule__mutmut_{n}" for n in (1, 2, 5)),
        "its own check dropped or made `<=`: _apply calls it only for a new, revived or "
        "earlier deadline; where the device still holds an earlier entry, dropped, it "
        "pushes the exact deadline and the earlier entry is dropped when it pops (`<=`: a "
        "second equal entry, dropped so): expire() acts alike, and next_deadline() gives "
        "the exact deadline instead of an earlier one, both what it promises",
    ),
    **dict.fromkeys(
        (
            f"kubelet_dra.state.healthinfo.xǁHealthCacheǁ_apply__mutmut_{n}"
            for n in (71, 75, 76, 77)
        ),
        "its check before _schedule() widened (`<=` made `<`, or `+` made `-` in the old "
        "deadline or the window so it never holds): `moved` is true more often, and "
        "_schedule() makes the same check (an entry only for a first or an earlier "
        "deadline), so only a call is added",
    ),
    "kubelet_dra.state.healthinfo.xǁHealthCacheǁ_apply__mutmut_78": (
        "`old_deadline <= expired_through` made `<`: expire() drops only entries before its "
        "time (_due keeps a deadline equal to it), so at equality the record still holds "
        "its entry; `<` is exact, `<=` only adds a call _schedule() ignores"
    ),
    "kubelet_dra.state.healthinfo.xǁHealthCacheǁ_apply__mutmut_58": (
        "the persist decision with health and message changes joined by and: unexpired, "
        "either change is visible (persisted anyway); expired, the persisted copy is older "
        "than the lease, so the half-lease renewal rule persists it anyway"
    ),
    "kubelet_dra.state.healthinfo.xǁHealthCacheǁ_apply__mutmut_99": (
        "the changed devices noted with the value '' instead of None: the dict is an "
        "ordered set, only its keys are read"
    ),
    **dict.fromkeys(
        (
            f"kubelet_dra.state.healthinfo.xǁHealthCacheǁ_delete_overdue__mutmut_{n}"
            for n in (11, 12, 13)
        ),
        "its skip check weakened (and for or, the pool left out of the key): a driver's "
        "overdue set is taken whole at each of its reports, so an overdue record renewed "
        "since was renewed by this very report and is unexpired; and one deleted since "
        "left the set with it, so the record is never missing (with a clock that never "
        "steps back: 11 deletes an overdue record the stepped-back clock finds unexpired)",
    ),
    **dict.fromkeys(
        (
            f"kubelet_dra.state.store.xǁHealthStoreǁ_load_chunks__mutmut_{n}"
            for n in (16, 17, 18, 19, 27, 28, 29, 30)
        ),
        "the text of a ValueError that load() catches (it then reads row by row): "
        "it is never logged or shown",
    ),
    # Round four (2026-12-03): podstatus, claims, taints, kube/podstate.
    "kubelet_dra.status.podstatus.x__cut__mutmut_2": (
        "`<=` made `<`: the only caller passes a size below the text's length (over >= 1 "
        "because one device did not fit), so neither test is ever true"
    ),
    "kubelet_dra.status.podstatus.x__cut__mutmut_6": (
        "decode('utf-8') made decode(): bytes.decode defaults to UTF-8"
    ),
    "kubelet_dra.status.podstatus.x__cut__mutmut_16": (
        "'utf-8' made 'UTF-8': codec names ignore case"
    ),
    "kubelet_dra.status.podstatus.x__merge_containers__mutmut_32": (
        "pop(key, None) made pop(key): merged_entries returns [] only when the current "
        "list was non-empty (an empty one gives None), so the key is always there"
    ),
    "kubelet_dra.status.podstatus.x__order_key__mutmut_11": (
        "'utf-8' made 'UTF-8': codec names ignore case"
    ),
    "kubelet_dra.status.podstatus.x__render__mutmut_5": (
        "zip(strict=False) made strict=None: zip only checks whether the value is true, "
        "and both are false"
    ),
    "kubelet_dra.status.podstatus.x__render__mutmut_8": (
        "zip(strict=False) left at the default, which is False"
    ),
    "kubelet_dra.status.podstatus.x_condition_message__mutmut_12": (
        "the search starting at 2: when only one device fits, it ends in the cut branch "
        "with over <= 0, where _cut leaves the text whole and the same one-device message"
        " comes out"
    ),
    "kubelet_dra.status.podstatus.x_condition_message__mutmut_13": (
        "upper bound n + 1: _render with kept > n renders like kept = n, already known "
        "not to fit, so the largest fitting count does not change"
    ),
    "kubelet_dra.status.podstatus.x_condition_message__mutmut_20": (
        "mid = (low + high + 2) // 2 still lies in (low, high] whenever low < high, so "
        "the search keeps its invariants and finds the same largest count"
    ),
    "kubelet_dra.status.podstatus.x_merge__mutmut_8": (
        "changed |= x made changed = x on the first update: changed is still False at that point"
    ),
    "kubelet_dra.status.podstatus.x_update_allocated_resources_status__mutmut_19": (
        "now=None for merge: with condition=False only _merge_containers runs, and it "
        "never reads now"
    ),
    "kubelet_dra.status.podstatus.x_update_allocated_resources_status__mutmut_20": (
        "condition=False made None: the function never asks for a condition type, so "
        "desired.condition is None and the condition half is skipped either way"
    ),
    "kubelet_dra.status.podstatus.x_update_allocated_resources_status__mutmut_24": (
        "condition=False left at the default True: the function never asks for a "
        "condition type, so desired.condition is None and the condition half is skipped "
        "either way"
    ),
    "kubelet_dra.status.podstatus.x_update_allocated_resources_status__mutmut_25": (
        "condition=False made True: the function never asks for a condition type, so "
        "desired.condition is None and the condition half is skipped either way"
    ),
    "kubelet_dra.status.claims.x_base_request__mutmut_4": (
        'split("/")[0] gives the same first part as split("/", 1)[0]'
    ),
    "kubelet_dra.status.claims.x_base_request__mutmut_7": (
        'split("/", 2)[0] gives the same first part as split("/", 1)[0]'
    ),
    "kubelet_dra.status.claims.xǁClaimIndexǁ_unlink__mutmut_5": (
        "continue to break on a key with no pod set: unreachable, every key unlinked is "
        "one of the pod's own claim keys, whose set (made by _link) holds the pod and is "
        "deleted only once empty"
    ),
    "kubelet_dra.status.claims.xǁClaimIndexǁdevices_of_pod__mutmut_8": (
        "`if key` made always true: devices_for(uid, None) finds no claim (none is stored"
        " under None) and returns None, so the loop runs over () either way"
    ),
    "kubelet_dra.status.claims.xǁClaimIndexǁresource_ids__mutmut_9": (
        "`if claim` made always true: unreachable, _claim_changed runs after every change"
        " to the API and prepared claims, so a claim key in _device_claims always has an "
        "effective claim"
    ),
    "kubelet_dra.taints.policy.x__cut__mutmut_4": (
        "'UTF-8' and 'utf-8' name the same codec: Python's codec lookup ignores case"
    ),
    "kubelet_dra.taints.policy.x__cut__mutmut_14": (
        "'UTF-8' and 'utf-8' name the same codec: Python's codec lookup ignores case"
    ),
    "kubelet_dra.taints.policy.x__cut__mutmut_9": (
        "bytes.decode() without an encoding always decodes UTF-8 in Python 3 (not the "
        "locale's encoding)"
    ),
    "kubelet_dra.taints.planner.x_rule_name__mutmut_38": (
        "strip('XX-XX') strips the characters X and -; the prefix is lowercased and "
        "reduced to [a-z0-9.-] first, so it never holds an X"
    ),
    "kubelet_dra.taints.planner.x_taint_from_rule__mutmut_27": (
        "parse_rfc3339('XXXX') is None like parse_rfc3339(''): both fall back to now"
    ),
    "kubelet_dra.taints.planner.x_valid_taint_key__mutmut_15": (
        "an empty name never fullmatches _QUALIFIED_NAME (at least one character), so 0 "
        "<= len(name) rejects it as 0 < len(name) does"
    ),
    "kubelet_dra.kube.podstate.x__foreign_ids__mutmut_12": (
        'the default of entry.get("name", "") is used only for an entry without a name, '
        "and then `None in managed` is false (our names are strings), so `want` is never "
        "read"
    ),
    "kubelet_dra.kube.podstate.x__foreign_ids__mutmut_14": (
        'the default of entry.get("name", "") is used only for an entry without a name, '
        "and then `None in managed` is false (our names are strings), so `want` is never "
        "read"
    ),
    "kubelet_dra.kube.podstate.x__foreign_ids__mutmut_17": (
        'the default of entry.get("name", "") is used only for an entry without a name, '
        "and then `None in managed` is false (our names are strings), so `want` is never "
        "read"
    ),
    "kubelet_dra.kube.podstate.x_kubelet_verdict__mutmut_28": (
        "changed/removed/kept start as None instead of False: they are only tested for truth"
    ),
    "kubelet_dra.kube.podstate.xǁPodStatesǁ_due__mutmut_3": (
        "the text of an assert message on an invariant no caller can break"
    ),
    "kubelet_dra.kube.podstate.xǁPodStatesǁ_due__mutmut_4": (
        "the text of an assert message on an invariant no caller can break"
    ),
    "kubelet_dra.kube.podstate.xǁPodStatesǁexpire_records__mutmut_1": (
        "drops the early return, so a scan runs when nothing is due yet; _next_expiry is "
        "a lower bound of every record's expiry, so the scan clears nothing (performance "
        "only)"
    ),
    "kubelet_dra.kube.podstate.xǁPodStatesǁexpire_records__mutmut_11": (
        "< made <= when keeping the earliest expiry: on a tie both keep the same value"
    ),
    "kubelet_dra.kube.podstate.xǁPodStatesǁset_record__mutmut_13": (
        "< made <= when keeping the earliest expiry: on a tie both keep the same value"
    ),
    "kubelet_dra.kube.podstate.xǁPodStatesǁset_record__mutmut_24": (
        "the else branch of the eviction key is unreachable: only states with a record are compared"
    ),
    "kubelet_dra.kube.podstate.xǁPodStatesǁset_record__mutmut_26": (
        "the else branch of the eviction key is unreachable: only states with a record are compared"
    ),
    "kubelet_dra.kube.podstate.xǁPodStateǁsent__mutmut_4": (
        'the value stored is "" instead of None: unconfirmed is an ordered set, only its '
        "keys are read"
    ),
}

KILLED = {1, 3}
TIMEOUT = {-24, 24, 152, 255, 36}
SURVIVED = {0}
NO_TESTS = {5, 33}


def module_of(path: str) -> str:
    return path.removeprefix("kubelet_dra/").removesuffix(".py")


def dotted(module: str) -> str:
    """The dotted name mutmut gives the module's mutants (from its file: the labels are short)."""
    return MODULES[module].removesuffix(".py").replace("/", ".")


def patterns(modules: Iterable[str]) -> list[str]:
    """The ``mutmut run`` arguments: every mutant in scope of ``modules``."""
    out: list[str] = []
    for module in modules:
        for function in SCOPE.get(module, ("*",)):
            out.append(f"{dotted(module)}.{function}__mutmut_*")
    return out


def alive(root: pathlib.Path, modules: Iterable[str]) -> list[str]:
    """The mutants in scope of ``modules`` that the last run did not detect."""
    detected = KILLED | TIMEOUT
    return sorted(
        name
        for module in modules
        for name, code in results(root, module).items()
        if code not in detected and name not in EQUIVALENT
    )


def run(
    root: pathlib.Path, modules: list[str], *, fresh: bool, children: int, survivors: bool
) -> int:
    """``mutmut run`` over ``modules``, niced (the machine is shared).

    With ``survivors``, only the mutants the last run did not detect: a test added
    since cannot revive a killed mutant, and mutmut keeps the other verdicts. The
    names are then explicit, so mutmut's clean run before the mutants runs only the
    tests that call their functions, not the whole selection (as globs make it).
    """
    if fresh:
        shutil.rmtree(root / "mutants", ignore_errors=True)
    names = alive(root, modules) if survivors else patterns(modules)
    if not names:
        return 0
    command = [sys.executable, "-m", "mutmut", "run", "--max-children", str(children)]
    niced = ["nice", "-n", "15"] if shutil.which("nice") else []
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([*niced, *command, *names], check=False, cwd=root, env=env).returncode


def short_name(name: str) -> tuple[str, str]:
    """``(function, number)`` of a mutant as the docs name it.

    ``kubelet_dra.plugin.validation.x_printable__mutmut_7`` is ``("validation.printable",
    "7")``: a function is named by its module's label in :data:`MODULES`.
    """
    function, number = name.rsplit("__mutmut_", 1)
    label = next(m for m in MODULES if function.startswith(dotted(m) + "."))
    mangled = function.removeprefix(dotted(label) + ".")
    # A method is "xǁ<Class>ǁ<method>": only the leading "xǁ" is mutmut's (a class
    # named "...Index" holds an "xǁ" of its own).
    plain = mangled.removeprefix("x_") if mangled.startswith("x_") else mangled.removeprefix("xǁ")
    return f"{label.replace('/', '.')}.{plain.replace('ǁ', '.')}", number


def in_scope(module: str, name: str) -> bool:
    function = name.removeprefix(dotted(module) + ".").rsplit("__mutmut_", 1)[0]
    return any(fnmatch.fnmatchcase(function, f) for f in SCOPE.get(module, ("*",)))


def results(root: pathlib.Path, module: str) -> dict[str, int | None]:
    meta = root / "mutants" / (MODULES[module] + ".meta")
    codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
    return {name: code for name, code in codes.items() if in_scope(module, name)}


def table(root: pathlib.Path, modules: Iterable[str]) -> tuple[list[str], list[str]]:
    lines = [
        "| module | mutants | killed | timed out | survived | no tests | other | equivalent "
        "| score |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    survivors: list[str] = []
    for module in modules:
        codes = results(root, module)
        killed = sum(code in KILLED for code in codes.values())
        timed_out = sum(code in TIMEOUT for code in codes.values())
        detected = KILLED | TIMEOUT
        equivalent = [n for n, c in codes.items() if c in SURVIVED and n in EQUIVALENT]
        alive = [n for n, c in codes.items() if c not in detected and n not in EQUIVALENT]
        survived = sum(c in SURVIVED for c in codes.values())
        no_tests = sum(c in NO_TESTS for c in codes.values())
        other = len(codes) - killed - timed_out - survived - no_tests
        counted = len(codes) - len(equivalent)
        score = f"{100 * (killed + timed_out) / counted:.1f} %" if counted else "-"
        lines.append(
            f"| {module} | {len(codes)} | {killed} | {timed_out} | {survived} | "
            f"{no_tests} | {other} | {len(equivalent)} | {score} |"
        )
        survivors.extend(f"{n} ({codes[n]})" for n in sorted(alive))
    return lines, survivors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=pathlib.Path, default=pathlib.Path.cwd())
    parser.add_argument("--survivors", action="store_true", help="list the mutants not killed")
    parser.add_argument("--patterns", action="store_true", help="print the mutmut run globs")
    parser.add_argument("--run", action="store_true", help="run mutmut first")
    parser.add_argument("--fresh", action="store_true", help="with --run: drop earlier results")
    parser.add_argument(
        "--rerun-survivors",
        action="store_true",
        help="with --run: try again only the mutants the last run did not detect",
    )
    parser.add_argument("--children", type=int, default=2, help="with --run: mutmut workers")
    parser.add_argument("modules", nargs="*", help=f"default: all of {', '.join(MODULES)}")
    args = parser.parse_args(argv)
    if unknown := [m for m in args.modules if m not in MODULES]:
        parser.error(f"unknown modules {unknown}; known: {', '.join(MODULES)}")
    args.modules = args.modules or list(MODULES)
    if args.patterns:
        print(" ".join(patterns(args.modules)))
        return 0
    if args.rerun_survivors and args.fresh:
        parser.error("--rerun-survivors needs the results of a run: not with --fresh")
    if args.run and (
        code := run(
            args.root,
            args.modules,
            fresh=args.fresh,
            children=args.children,
            survivors=args.rerun_survivors,
        )
    ):
        return code
    lines, survivors = table(args.root, args.modules)
    print("\n".join(lines))
    if args.survivors:
        print("\n".join(survivors))
    return 0


if __name__ == "__main__":
    sys.exit(main())
