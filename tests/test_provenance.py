"""The own kernel's source digest in env.json, and `python -m suite provenance`, which matches a
run to the commits whose kernel it measured (a GPU machine's copy of the checkout can carry a
stale .git, so the recorded commit alone can be wrong)."""
import json
import subprocess

import pytest

from suite import provenance
from suite.results import environment


def _git(repo, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                          capture_output=True, text=True, check=True).stdout.strip()


def _commit(repo, files, message):
    for rel, text in files.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path):
    """Three commits: a kernel, the kernel changed, then only a note beside it."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    first = _commit(repo, {"own_kernel/__init__.py": "", "own_kernel/k.py": "x = 1\n"}, "one")
    second = _commit(repo, {"own_kernel/k.py": "x = 2\n"}, "two")
    third = _commit(repo, {"own_kernel/README.md": "notes\n", "results/a.csv": "a\n"}, "three")
    return repo, (first, second, third)


def test_a_blob_id_is_gits():
    # `printf 'hello\n' | git hash-object --stdin`
    assert provenance.blob_id(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"


def test_the_files_on_disk_give_the_commits_digest(repo):
    root, (first, second, third) = repo
    on_disk = provenance.tree_digest(root / "own_kernel")
    assert on_disk == provenance.commit_digest(third, root)
    assert on_disk == provenance.commit_digest(second, root)  # a README is not the kernel
    assert on_disk != provenance.commit_digest(first, root)
    (root / "own_kernel" / "__pycache__").mkdir()
    (root / "own_kernel" / "__pycache__" / "k.cpython-312.pyc").write_bytes(b"\0")
    assert provenance.tree_digest(root / "own_kernel") == on_disk
    (root / "own_kernel" / "k.py").write_text("x = 3\n")
    assert provenance.tree_digest(root / "own_kernel") != on_disk


def test_a_digest_matches_the_commits_with_that_kernel(repo):
    root, (first, second, third) = repo
    digest = provenance.commit_digest(second, root)
    assert provenance.matching_commits(digest, root) == [third, second]
    assert provenance.matching_commits(digest, root, max_count=1) == [third]


def test_env_json_records_the_imported_kernels_digest():
    env = environment("cpu")
    assert env["own_kernel_digest"] == provenance.installed_digest()
    assert len(env["own_kernel_digest"]) == 64


def test_the_command_names_the_commits_a_run_measured(repo, tmp_path, capsys, monkeypatch):
    root, (first, second, third) = repo
    run = tmp_path / "run"
    run.mkdir()
    # recorded at the first commit (a stale .git), the kernel the second's
    (run / "env.json").write_text(json.dumps({
        "git_commit": first, "git_dirty": True,
        "own_kernel_digest": provenance.commit_digest(second, root)}))
    # a resumed run's second process, at the first commit's kernel
    (run / "env-2.json").write_text(json.dumps({
        "git_commit": first, "own_kernel_digest": provenance.commit_digest(first, root)}))
    old = tmp_path / "old"
    old.mkdir()
    (old / "env.json").write_text(json.dumps({"git_commit": first}))
    monkeypatch.setattr(provenance, "ROOT", root)
    args = provenance.argparse.Namespace(runs=[run, old], commits=400)
    assert provenance.main(args) == 0
    out = capsys.readouterr().out
    assert f"env.json: recorded commit {first} (dirty)" in out
    assert f"2 of HEAD's last 400 commits: {third[:12]}, {second[:12]}" in out
    assert f"env-2.json: recorded commit {first} (dirty unknown)" in out
    assert f"1 of HEAD's last 400 commits: {first[:12]}" in out
    assert out.index("env.json:") < out.index("env-2.json:")
    assert "no own_kernel_digest" in out
    with pytest.raises(SystemExit, match="no env.json"):
        provenance.main(provenance.argparse.Namespace(runs=[tmp_path], commits=400))
