"""The operator's own command lines against the converged box (0.17.1 patched): check mode, revert,
apply and the other release, each checked on its structured results and on the bytes it left;
testinfra (tests/) then checks the box itself."""

import difflib
import re

import yaml

PLAYBOOK = "molecule/vllm_eagle3_patch/converge.yml"
ROLE = "vllm_eagle3_patch"
SITE = "lib/python3.11/site-packages"
TARGETS = (
    "config/speculative.py",
    "model_executor/models/deepseek_v2.py",
    "model_executor/models/kimi_k25.py",
    "v1/spec_decode/eagle.py",
)
REVERT = ("-e", "vllm_eagle3_patch_state=absent")
REFUSED = re.compile(
    r"models/kimi_k25\.py \(sha256 [0-9a-f]{12}\); a locally modified or unknown build, nothing was changed"
)


def patch_result(run, host):
    """The role's one vllm_eagle3_patch call."""
    return run.one(host=host, role=ROLE, action="vllm_eagle3_patch")


def report(run, host):
    """The line the role reports after the patch (vLLM <version>: patch <line>, wrote ...)."""
    return run.one(host=host, role=ROLE, file="vllm_eagle3_patch/tasks/main.yml", action="debug").msg


def restarts(run, host):
    """Results of converge.yml's stand-in restart handler (defined inline: the play's only shell task)."""
    return run.select(host=host, file=PLAYBOOK, action="ansible.builtin.shell")


def removed_lines(result):
    """The '-' lines of the module's per-file diffs, as --diff prints them."""
    diffs = result.result.get("diff") or []
    lines = []
    for diff in [diffs] if isinstance(diffs, dict) else diffs:
        lines += [
            line
            for line in difflib.unified_diff(
                diff["before"].splitlines(), diff["after"].splitlines(), lineterm=""
            )
            if line.startswith("-") and not line.startswith("---")
        ]
    return lines


def side_effect(scenario):
    host = scenario.host
    box = scenario.box
    releases = yaml.safe_load((scenario.directory / "vars" / "releases.yml").read_text())
    pristine = releases["vllm_eagle3_molecule_pristine"]
    venvs = {release["version"]: release["venv"] for release in releases["vllm_eagle3_molecule_releases"]}
    v16 = ("-e", f"vllm_venv={venvs['0.16.0']}")

    def play(*args):
        return scenario.play(PLAYBOOK, *args)

    def identical(version, *options):
        """diff -r of a release's installed package against its untouched copy, pyc caches aside."""
        return box.sh(
            f"diff -r --exclude=__pycache__ {' '.join(options)} "
            f"{pristine}/{version}/vllm {venvs[version]}/{SITE}/vllm",
            check=False,
        )

    # A check-mode revert with --diff reports the change and its diff, notifies the restart (skipped
    # in check mode), and moves no byte.
    hash_targets = "sha256sum " + " ".join(f"{venvs['0.17.1']}/{SITE}/vllm/{path}" for path in TARGETS)
    hashes_before = box.out(hash_targets)
    check_revert = play(*REVERT, "--check", "--diff")
    assert check_revert.ok, str(check_revert)
    assert check_revert.changed(host) > 0, str(check_revert)
    removed = removed_lines(patch_result(check_revert, host))
    assert "-    SupportsEagle3," in removed, str(check_revert)
    assert '-            "kimi_k25",' in removed, str(check_revert)
    notified = restarts(check_revert, host)
    assert notified and all(r.status == "skipped" for r in notified), str(check_revert)
    assert box.out(hash_targets) == hashes_before, str(check_revert)

    # The revert restarts the server and leaves every byte as upstream shipped it (no backups left).
    reverted = play(*REVERT)
    assert reverted.ok and reverted.changed(host) > 0, str(reverted)
    assert reverted.ran(host=host, file=PLAYBOOK, action="ansible.builtin.shell"), str(reverted)
    diff = identical("0.17.1")
    assert diff.returncode == 0, diff.stdout[:2000]

    # A second revert changes nothing; check mode reports the apply without writing.
    reverted_again = play(*REVERT)
    assert reverted_again.ok and reverted_again.changed(host) == 0, str(reverted_again)
    assert not patch_result(reverted_again, host).changed, str(reverted_again)
    assert not restarts(reverted_again, host), str(reverted_again)
    check_apply = play("--check")
    assert check_apply.ok and check_apply.changed(host) > 0, str(check_apply)
    message = report(check_apply, host)
    assert "patch 0.17, would write vllm/config/speculative.py, " in message, str(check_apply)
    notified = restarts(check_apply, host)
    assert notified and all(r.status == "skipped" for r in notified), str(check_apply)
    diff = identical("0.17.1")
    assert diff.returncode == 0, diff.stdout[:2000]

    reapplied = play()
    assert reapplied.ok and reapplied.changed(host) > 0, str(reapplied)
    message = report(reapplied, host)
    assert "vLLM 0.17.1: patch 0.17, wrote vllm/config/speculative.py, " in message, str(reapplied)

    # 0.16.0: apply (restart notified), repeat (nothing), revert (upstream bytes).
    v16_applied = play(*v16)
    assert v16_applied.ok and v16_applied.changed(host) > 0, str(v16_applied)
    message = report(v16_applied, host)
    assert "vLLM 0.16.0: patch 0.16, wrote vllm/config/speculative.py, " in message, str(v16_applied)
    assert v16_applied.ran(host=host, file=PLAYBOOK, action="ansible.builtin.shell"), str(v16_applied)
    v16_again = play(*v16)
    assert v16_again.ok and v16_again.changed(host) == 0, str(v16_again)
    assert not patch_result(v16_again, host).changed, str(v16_again)
    assert not restarts(v16_again, host), str(v16_again)
    v16_reverted = play(*v16, *REVERT)
    assert v16_reverted.ok and v16_reverted.changed(host) > 0, str(v16_reverted)
    diff = identical("0.16.0")
    assert diff.returncode == 0, diff.stdout[:2000]

    # A target file altered, as a local hotfix would: refused in one line naming it, nothing written.
    kimi = "vllm/model_executor/models/kimi_k25.py"
    installed = f"{venvs['0.16.0']}/{SITE}/{kimi}"
    box.sh(f"echo '# local hotfix' >> {installed}")
    v16_refused = play(*v16)
    assert not v16_refused.ok, str(v16_refused)
    refusal = patch_result(v16_refused, host)
    assert refusal.status == "failed" and REFUSED.search(refusal.msg), str(v16_refused)
    assert not restarts(v16_refused, host), str(v16_refused)
    differing = identical("0.16.0", "-q").stdout
    assert len(differing.splitlines()) == 1 and "kimi_k25.py differ" in differing, differing

    # The upstream file back, and 0.16.0 patched once more (verify then checks the box).
    box.sh(f"cp {pristine}/0.16.0/{kimi} {installed} && chmod 0644 {installed}")
    v16_final = play(*v16)
    assert v16_final.ok and v16_final.changed(host) > 0, str(v16_final)
