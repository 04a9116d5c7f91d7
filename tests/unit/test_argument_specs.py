"""Each role's meta/argument_specs.yml matches its defaults/main.yml (scripts/check-argument-specs.py)."""

import pathlib

import script_module

REPO = pathlib.Path(__file__).resolve().parent.parent.parent
SCRIPT = REPO / "scripts" / "check-argument-specs.py"


check_argument_specs = script_module.load(SCRIPT, "check_argument_specs")


def test_every_role_spec_matches_its_defaults():
    problems, roles, options = check_argument_specs.check(REPO / "roles")
    assert not problems, "argument specs differ from defaults/main.yml:\n" + "\n".join(problems)
    assert roles > 0 and options > 0


def write_role(roles_dir, defaults, spec):
    role = roles_dir / "demo"
    (role / "defaults").mkdir(parents=True)
    (role / "meta").mkdir()
    (role / "defaults" / "main.yml").write_text(defaults)
    (role / "meta" / "argument_specs.yml").write_text(spec)


def test_a_mismatching_spec_is_reported(tmp_path):
    write_role(
        tmp_path,
        '---\ndemo_path: "{{ other }}/x"\ndemo_count: 3\ndemo_flag: true\ndemo_unlisted: 1\n',
        "---\nargument_specs:\n  main:\n    options:\n"
        "      demo_path: {type: path}\n"
        "      demo_count: {type: int, default: 4, required: true}\n"
        "      demo_flag: {type: bool, default: 1}\n"
        "      demo_name: {type: str}\n"
        "      demo_needed: {type: str, required: true}\n",
    )
    problems, roles, options = check_argument_specs.check(tmp_path)
    assert (roles, options) == (1, 5)
    assert problems == [
        "roles/demo: demo_unlisted: in defaults/main.yml but not an option of main",
        'roles/demo: demo_path: spec default null != defaults/main.yml "{{ other }}/x"',
        "roles/demo: demo_count: required: true, but defaults/main.yml always sets it",
        "roles/demo: demo_count: spec default 4 != defaults/main.yml 3",
        "roles/demo: demo_flag: spec default 1 != defaults/main.yml true",
        "roles/demo: demo_name: no default in defaults/main.yml and not required: true",
    ]
    assert check_argument_specs.main(["check", str(tmp_path)]) == 1


def test_a_matching_spec_passes(tmp_path, capsys):
    write_role(
        tmp_path,
        '---\ndemo_path: "{{ other }}/x"\n',
        "---\nargument_specs:\n  main:\n    options:\n"
        '      demo_path: {type: path, default: "{{ other }}/x"}\n',
    )
    assert check_argument_specs.main(["check", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "argument specs match defaults: 1 roles, 1 options\n"
