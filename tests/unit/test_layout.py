"""The layout docs/development.md draws: each package of vocagno imports only the packages on floors below it, and
the core imports no training framework."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Lowest first: a module may import its own package and any package on a lower floor (the commands, vocagno/*.py,
# stand above them all). compat, one door per training framework, stands above the doors and below all that trains.
FLOORS = [("shown",), ("errors", "entry", "memory"), ("doors",), ("compat",), ("core",), ("data",), ("conversion",),
          ("teacher",), ("algorithms",), ("training",), ("diagnostics", "eval")]
FLOOR = {name: level for level, names in enumerate(FLOORS) for name in names}


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, at its top or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_each_package_imports_only_the_floors_below_it():
    upward = []
    for path in sorted((REPO / "vocagno").rglob("*.py")):
        parts = path.relative_to(REPO / "vocagno").with_suffix("").parts
        if len(parts) == 1 and parts[0] not in FLOOR:
            continue  # a command: python -m vocagno.NAME
        mine = FLOOR[parts[0]]
        for module in imported(path):
            if not module.startswith("vocagno."):
                continue
            theirs = module.split(".")[1]
            if theirs != parts[0] and FLOOR.get(theirs, len(FLOORS)) >= mine:
                upward.append(f"{path.relative_to(REPO)} imports {module}")
    assert not upward, upward


def test_the_core_needs_no_training_framework():
    frameworks = ("composer", "streaming", "llmfoundry")
    found = [f"{path.relative_to(REPO)} imports {module}" for path in sorted((REPO / "vocagno" / "core").rglob("*.py"))
             for module in imported(path) if module.split(".")[0] in frameworks]
    assert not found, found


def test_git_tracks_no_build_output():
    """Wheels, converted shards, runs, checkpoints, reports and coverage data stay out of the repository; the only
    weights it holds are the shipped tiny teachers (vocagno/assets/README.md says where they come from)."""
    import subprocess

    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, f"the tests run from a git checkout: {listed.stderr.strip()}"
    built = ("/.whl/", "/shards/", "/runs/", "/checkpoints/", "/gpu_report/", "/eval_results/", ".egg-info/",
             "/.coverage")
    weights = (".whl", ".pt", ".pth", ".bin", ".safetensors", ".mds", ".mds.zstd", ".distcp")
    found = [path for path in listed.stdout.splitlines() if any(part in f"/{path}" for part in built)
             or (path.endswith(weights) and not path.startswith("vocagno/assets/models/"))]
    assert not found, f"build outputs tracked by git: {found[:10]}"
    for folder in (".whl/", "/shards/", "/runs/", "/checkpoints/", "/gpu_report/", ".coverage"):
        assert folder in (REPO / ".gitignore").read_text(), folder
