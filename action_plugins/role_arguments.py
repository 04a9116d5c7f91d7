"""Check the arguments of every role a play runs, (library/role_arguments.py documents it)."""

from __future__ import annotations

from ansible.errors import AnsibleUndefinedVariable
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase

ARGUMENT_SPEC = {
    "skip": {"type": "list", "elements": "str", "default": []},
    "only": {"type": "list", "elements": "str", "default": []},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        # The play's roles as Ansible loaded them (each import_role adds its role): their own argument specs,
        # found where Ansible found the role, never by a path relative to another role.
        roles = {role.get_name(): role for role in self._task.get_play().get_roles()}
        spec = {}
        for name in sorted(roles):
            if name not in args["skip"]:
                spec.update(((roles[name]._get_role_argspecs() or {}).get("main") or {}).get("options") or {})
        if args["only"]:
            spec = {name: option for name, option in spec.items() if name in args["only"]}
        values, deferred = {}, []
        for name in spec:
            if name not in task_vars:
                continue
            try:
                values[name] = self._templar.template(task_vars[name])
            except AnsibleUndefinedVariable:
                # A default derived from what is read on the box (the GPUs on its bus): checked by the role
                # itself once that is known, not guessed here.
                deferred.append(name)
        for name in deferred:
            spec.pop(name)
        checked = ArgumentSpecValidator(spec).validate(values, validate_role_argument_spec=True)
        result.update(changed=False, roles=sorted(set(roles) - set(args["skip"])), deferred=sorted(deferred))
        if checked.error_messages:
            result.update(
                failed=True, msg="; ".join(checked.error_messages), argument_errors=checked.error_messages
            )
        return result
