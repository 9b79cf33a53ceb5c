"""May the SSH user start and stop systemd units on the host? Asked before the first action that needs it
(and by `profile check`), so a refusal comes with its fix before anything is stopped.

With the systemd manager every stage and derived server starts with `systemd-run` on the system manager
and every switch uses `systemctl stop/start`: both are polkit's `org.freedesktop.systemd1.manage-units`,
which asks a non-root user for admin authentication, and a non-interactive SSH command has no agent to
answer it ("Interactive authentication required."). The probe has no side effect:

- `[server] sudo = true`: `sudo -n systemctl --version` (sudo without a password, as every command will
  use it; systemctl rather than `true`, so a sudoers rule naming only systemctl and systemd-run passes).
- otherwise: `systemctl start --no-ask-password` of a unit that does not exist. systemd loads the name
  (a missing unit loads as not-found), checks manage-units, and only then refuses the job: "Unit ... not
  found." means the user may manage units; "Interactive authentication required." / "Access denied" means
  it may not. Nothing is started either way.
"""
from __future__ import annotations

from dataclasses import dataclass

from console.host.base import CommandResult, Host
from console.parsers.text import clean
from console.profile import Profile

# never a real unit (the project's own prefix, a name no operator gives a service)
PROBE_UNIT = "eagle3-console-permission-probe-nonexistent.service"
PROBE_TIMEOUT_S = 30.0
POLKIT_ACTION = "org.freedesktop.systemd1.manage-units"
_DENIED = ("interactive authentication required", "access denied", "not authorized", "permission denied")
_SUDO_DENIED = ("a password is required", "not in the sudoers", "may not run sudo", "is not allowed to",
                "sudo: command not found", "sudo: not found", "no tty present", "a terminal is required")


@dataclass(frozen=True)
class Permission:
    ok: bool
    message: str  # allowed: what was seen; refused: why, and the fix


def probe_argv(profile: Profile) -> list[str]:
    if profile.server.sudo:
        return ["sudo", "-n", "systemctl", "--version"]
    return ["systemctl", "start", "--no-ask-password", PROBE_UNIT]


def polkit_rule(user: str) -> str:
    return ("polkit.addRule(function(action, subject) {\n"
            f'    if (action.id == "{POLKIT_ACTION}" && subject.user == "{user}") {{\n'
            "        return polkit.Result.YES;\n"
            "    }\n"
            "});")


def judge(profile: Profile, user: str, res: CommandResult) -> Permission:
    """What the probe's answer means (pure: tested on the answers systemd and sudo give)."""
    said = clean(" ".join(line.strip() for line in (res.stderr or res.stdout).splitlines() if line.strip()))[:300]
    host = profile.host.name
    if profile.server.sudo:
        if res.ok:
            return Permission(True, f"{user} runs sudo without a password on {host}")
        return Permission(False, (
            f"the profile says [server] sudo = true, but {user} cannot run sudo without a password on {host} "
            f"(`{' '.join(probe_argv(profile))}`: {said or f'exit {res.returncode}'}), and every systemctl and systemd-run goes "
            f"through `sudo -n`. Fix: give {user} passwordless sudo (a sudoers rule, e.g. `{user} ALL=(root) "
            f"NOPASSWD: /usr/bin/systemctl, /usr/bin/systemd-run`), or set sudo = false and allow {user} "
            f"{POLKIT_ACTION} with a polkit rule (/etc/polkit-1/rules.d/50-eagle3-console.rules):\n"
            f"{polkit_rule(user)}"))
    low = said.lower()
    if "not found" in low or "not loaded" in low:
        return Permission(True, f"{user} may start and stop systemd units on {host}")
    if any(d in low for d in _DENIED):
        return Permission(False, (
            f"{user} may not start or stop systemd units on {host} without a password: every stage and server "
            f"starts with systemd-run and every switch runs systemctl stop/start, which polkit's "
            f"{POLKIT_ACTION} refuses over a non-interactive SSH command (`{' '.join(probe_argv(profile))}`: "
            f"{said}). Nothing was stopped. Fix: set [server] sudo = true in the profile (with passwordless "
            f"sudo for {user}), or allow {user} with a polkit rule "
            f"(/etc/polkit-1/rules.d/50-eagle3-console.rules):\n{polkit_rule(user)}"))
    return Permission(True, f"could not tell whether {user} may manage systemd units on {host} "
                            f"(`{' '.join(probe_argv(profile))}`: {said or f'exit {res.returncode}'})")


async def check_permission(host: Host, profile: Profile) -> Permission | None:
    """The probe's verdict (None: nothing to check, a tmux host or root). Raises HostError when the host
    does not answer."""
    if profile.server.manager != "systemd":
        return None
    who = await host.run(["id", "-un"], timeout=PROBE_TIMEOUT_S)
    user = clean(who.stdout.strip()) or "the SSH user"
    if user == "root" and not profile.server.sudo:
        return None
    return judge(profile, user, await host.run(probe_argv(profile), timeout=PROBE_TIMEOUT_S))
