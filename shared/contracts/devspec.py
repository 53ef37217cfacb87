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

DEV_SCRIPT = f"""\
if [ -z "${{GPUYARD_DEV_PORT:-}}" ] || [ -z "${{JUPYTER_TOKEN:-}}" ]; then
  echo "gpuyard dev: the executor of node ${{GPUYARD_NODE:-?}} gives dev environments no port or token" \
"(it runs an older GPUYARD, or has no publish secret)" >&2
  exit {NOT_INSTALLED_EXIT}
fi
if ! python -c 'import jupyterlab' >/dev/null 2>&1; then
  echo "gpuyard dev: JupyterLab is not installed for $(command -v python || echo "python (none on the PATH)") on node" \
"${{GPUYARD_NODE:-?}}: ${{GPUYARD_DEV_INSTALL:-install GPUYARD's dev extra}} there (or add jupyterlab to the job's" \
"environment: pip)" >&2
  exit {NOT_INSTALLED_EXIT}
fi
mkdir -p "$GPUYARD_DEV_ROOT" || exit 1
export JUPYTER_RUNTIME_DIR="${{JUPYTER_RUNTIME_DIR:-$PWD/.jupyter-runtime}}"
echo "gpuyard dev: JupyterLab starts on 127.0.0.1:$GPUYARD_DEV_PORT, notebooks in $GPUYARD_DEV_ROOT"
exec python -m jupyterlab --no-browser --ip=127.0.0.1 --port="$GPUYARD_DEV_PORT" \
  --ServerApp.port_retries=0 --ServerApp.base_url="{DEV_PATH}/$GPUYARD_JOB_ID/" \
  --ServerApp.root_dir="$GPUYARD_DEV_ROOT" --ServerApp.open_browser=False \
  --ServerApp.quit_button=False --ServerApp.allow_root=True --LabApp.news_url=None \
  --LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate --LabApp.extension_manager=readonly
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
