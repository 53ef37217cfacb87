"""A dev environment (docs/dev.md): a job whose replica runs JupyterLab, reached only through the platform at
`/dev/{job id}/` (the submit service's proxy, then the node's executor gateway).

A job with a `dev` block has no command of its own: it runs `DEV_SCRIPT`, which starts JupyterLab with the
Python the job runs with (the node's, or its `environment:`'s), on loopback, on the port the executor gives it
(GPUYARD_DEV_PORT) and with the token the executor gives it (JUPYTER_TOKEN: derived from a secret only the
platform holds, `gpuyard.shared.auth.devtoken`; never in the spec, the command line or the API), its pages under
`/dev/{job id}/`, its notebook folder `dev.root` (where the submit service mounts the user's own volume).
"""

from __future__ import annotations

from pydantic import Field

from gpuyard.shared.contracts.fieldtypes import Strict

DEV_PATH = "/dev"
"""Where a dev environment's pages are, on the submit service's address: `/dev/{job id}/`."""
NOT_INSTALLED_EXIT = 3
"""DEV_SCRIPT's exit status when JupyterLab is not installed for the job's Python (its one line says how)."""
DEFAULT_ROOT = "notebooks"
LAB_FOLDER = ".jupyter/lab"
"""JupyterLab's user settings and workspaces, in the notebook folder: they follow the user's notebooks volume
from one environment to the next (a hidden folder: JupyterLab's file browser does not show it)."""
NEWS_SETTINGS = "@jupyterlab/apputils-extension/notification.jupyterlab-settings"
NEWS_OFF = '{"fetchNews": "false", "checkForUpdates": false}'
"""JupyterLab's news, off until the user turns it on (its settings): it would ask at every first start, and a
node has no reason to reach the Jupyter project's site."""
LSP_SETTINGS = "@jupyterlab/lsp-extension/plugin.jupyterlab-settings"
"""Where the user turns JupyterLab's language servers on (off by default in JupyterLab 4): only then does its
server extension (jupyter_lsp, which looks for language servers at every start) run."""
LAB_LAUNCHER = """
import importlib.util, sys, types
if importlib.util.find_spec("rfc3987_syntax"):
    deferred = types.ModuleType("rfc3987_syntax")
    def is_valid_syntax(term, value):
        if sys.modules.get("rfc3987_syntax") is deferred:
            del sys.modules["rfc3987_syntax"]
        from rfc3987_syntax import is_valid_syntax as imported
        return imported(term, value)
    deferred.is_valid_syntax = is_valid_syntax
    sys.modules["rfc3987_syntax"] = deferred
from jupyterlab.labapp import main
sys.exit(main())
"""
"""`python -m jupyterlab`, less a third of its start: the server's event schemas are checked with jsonschema's
format checkers, which import `rfc3987_syntax` (through `jsonschema[format-nongpl]`), and that module builds
a parser for its grammar when imported (about a second). Here it is imported at its first use instead, in the
server's process only (kernels and terminals are processes of their own). No single quote: it is quoted so in
DEV_SCRIPT."""

HAS_JUPYTERLAB = 'import importlib.util, sys; sys.exit(importlib.util.find_spec("jupyterlab") is None)'
"""Whether the job's Python has JupyterLab, without importing it (which takes as long as a third of its start)."""

DEV_SCRIPT = f"""\
if [ -z "${{GPUYARD_DEV_PORT:-}}" ] || [ -z "${{JUPYTER_TOKEN:-}}" ]; then
  echo "gpuyard dev: the executor of node ${{GPUYARD_NODE:-?}} gives dev environments no port or token" \
"(it runs an older GPUYARD, or has no publish secret)" >&2
  exit {NOT_INSTALLED_EXIT}
fi
if ! python -c '{HAS_JUPYTERLAB}' >/dev/null 2>&1; then
  echo "gpuyard dev: JupyterLab is not installed for $(command -v python || echo "python (none on the PATH)") on node" \
"${{GPUYARD_NODE:-?}}: ${{GPUYARD_DEV_INSTALL:-install GPUYARD's dev extra}} there (or add jupyterlab to the job's" \
"environment: pip)" >&2
  exit {NOT_INSTALLED_EXIT}
fi
mkdir -p "$GPUYARD_DEV_ROOT" || exit 1
export JUPYTER_RUNTIME_DIR="${{JUPYTER_RUNTIME_DIR:-$PWD/.jupyter-runtime}}"
export JUPYTERLAB_SETTINGS_DIR="${{JUPYTERLAB_SETTINGS_DIR:-$PWD/$GPUYARD_DEV_ROOT/{LAB_FOLDER}/user-settings}}"
export JUPYTERLAB_WORKSPACES_DIR="${{JUPYTERLAB_WORKSPACES_DIR:-$PWD/$GPUYARD_DEV_ROOT/{LAB_FOLDER}/workspaces}}"
NEWS="$JUPYTERLAB_SETTINGS_DIR/{NEWS_SETTINGS}"
[ -e "$NEWS" ] || {{ mkdir -p "${{NEWS%/*}}" && echo '{NEWS_OFF}' > "$NEWS"; }}
LSP=False
grep -qs '"activate"[[:space:]]*:[[:space:]]*"on"' "$JUPYTERLAB_SETTINGS_DIR/{LSP_SETTINGS}" && LSP=True
echo "gpuyard dev: JupyterLab starts on 127.0.0.1:$GPUYARD_DEV_PORT, notebooks in $GPUYARD_DEV_ROOT"
exec python -c '{LAB_LAUNCHER}' --no-browser --ip=127.0.0.1 --port="$GPUYARD_DEV_PORT" \
  --ServerApp.port_retries=0 --ServerApp.base_url="{DEV_PATH}/$GPUYARD_JOB_ID/" \
  --ServerApp.root_dir="$GPUYARD_DEV_ROOT" --ServerApp.open_browser=False \
  --ServerApp.quit_button=False --ServerApp.allow_root=True --LabApp.news_url=None \
  --LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate --LabApp.extension_manager=readonly \
  --ServerApp.jpserver_extensions="{{'jupyter_lsp': $LSP}}"
"""
"""The replica's command: JupyterLab in the foreground (the replica ends when it does), or one line saying why
it cannot start and NOT_INSTALLED_EXIT."""


class DevSpec(Strict):
    """A dev environment: JupyterLab in one replica, reached at `/dev/{job id}/` (docs/dev.md)."""

    root: str = Field(
        DEFAULT_ROOT,
        max_length=255,
        pattern=r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$",
        description="The notebook folder, in the job's working directory: where the user's own volume "
        "(`dev-<user>`) is mounted when the platform has volumes, so that notebooks outlive the environment.",
    )

    def argv(self) -> list[str]:
        """The replica's command: DEV_SCRIPT, with its notebook folder."""
        return ["/bin/sh", "-c", f'GPUYARD_DEV_ROOT="{self.root}"\n{DEV_SCRIPT}']


def dev_url(job_id: str) -> str:
    """A dev environment's path on the submit service's address."""
    return f"{DEV_PATH}/{job_id}/lab"
