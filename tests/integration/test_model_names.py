"""A name is its owner's, through the real platform (`gpuyard up`): tenant alpha's private `mnist` and tenant
beta's public `mnist` are both deployed; alpha's `/v2/models/mnist` is alpha's model, and while alpha's is
undeployed and deployed again, every one of alpha's requests is answered by alpha's model or with 503 (its
model has no ready replica), never by beta's; beta's is reached by its qualified name `beta/mnist`
(tritonclient's `infer("beta/mnist")` too), and a tenant with no `mnist` gets 404, not beta's."""

from __future__ import annotations

import json
import threading

import httpx
import numpy as np
import pytest
import tritonclient.http as triton

from tests.integration.conftest import wait_for
from tests.unit.services.serving.models import Mlp

pytestmark = pytest.mark.integration

MINE, THEIRS = Mlp(seed=1), Mlp(seed=2)
X = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
BODY = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4], "data": X.ravel().tolist()}]}


def whose(answer: httpx.Response) -> str:
    """'mine' (alpha's model answered), 'theirs' (beta's), or the status and the error of a refusal."""
    if answer.status_code != 200:
        return f"{answer.status_code}: {answer.json().get('error')}"
    y = np.array(answer.json()["outputs"][0]["data"], dtype=np.float32).reshape(2, 3)
    if np.allclose(y, MINE(X), rtol=1e-5):
        return "mine"
    return "theirs" if np.allclose(y, THEIRS(X), rtol=1e-5) else f"neither: {y.tolist()}"


def test_a_name_is_its_owners_while_it_is_redeployed(platform, tmp_path):
    def cli(*args: str) -> str:
        done = platform.cli(*args)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def deploy(tenant: str) -> str:
        out = cli("models", "deploy", "mnist", "--tenant", tenant, "--gpus", "0.25", "--cpus", "0.1",
                  "--memory", "256MB", "--json")  # fmt: skip
        [job] = json.loads(out)["jobs"]
        return job["job_id"]

    for tenant, model, shared in (("alpha", MINE, []), ("beta", THEIRS, ["--public"])):
        path = tmp_path / f"{tenant}.onnx"
        path.write_bytes(model.bytes)
        cli("models", "publish", str(path), "--name", "mnist", "--tenant", tenant, *shared)
    alpha = {"Authorization": f"Bearer {cli('admin', 'tokens', 'create', '--tenant', 'alpha').strip()}"}
    gamma = {"Authorization": f"Bearer {cli('admin', 'tokens', 'create', '--tenant', 'gamma').strip()}"}
    first, beta_job = deploy("alpha"), deploy("beta")
    for job in (first, beta_job):
        platform.wait_state(job, {"running"})

    serving = f"http://127.0.0.1:{platform.serving_port}"
    with httpx.Client(base_url=serving, timeout=30) as http:

        def ask(path: str, headers: dict) -> str:
            return whose(http.post(path, json=BODY, headers=headers))

        wait_for(lambda: ask("/v2/models/mnist/infer", alpha) == "mine", 30, what="alpha's mnist answering")
        assert ask("/v2/models/beta/mnist/infer", alpha) == "theirs"
        refused = ask("/v2/models/mnist/infer", gamma)
        assert refused.startswith("404: unknown model 'mnist'"), refused
        assert ask("/v2/models/beta/mnist/infer", gamma) == "theirs"
        client = triton.InferenceServerClient(f"127.0.0.1:{platform.serving_port}")
        given = triton.InferInput("x", [2, 4], "FP32")
        given.set_data_from_numpy(X)
        answer = client.infer("beta/mnist", [given], headers=dict(alpha))  # (tritonclient adds to it)
        np.testing.assert_allclose(answer.as_numpy("y"), THEIRS(X), rtol=1e-5)
        client.close()

        # alpha's mnist is undeployed and deployed again while alpha keeps asking for it by its name
        outcomes: list[str] = []
        stop = threading.Event()

        def keep_asking() -> None:
            with httpx.Client(base_url=serving, timeout=30) as own:
                while not stop.is_set():
                    try:
                        outcomes.append(whose(own.post("/v2/models/mnist/infer", json=BODY, headers=alpha)))
                    except Exception as exc:
                        outcomes.append(f"failed: {exc!r}")

        asking = threading.Thread(target=keep_asking, daemon=True)
        asking.start()
        try:
            wait_for(lambda: "mine" in outcomes, 15, what="alpha's requests answered by its model")
            cli("models", "undeploy", "mnist", "--tenant", "alpha")
            platform.wait_state(first, {"cancelled"})
            gone = len(outcomes)
            wait_for(
                lambda: any(o.startswith("503") for o in outcomes[gone:]),
                15,
                what="alpha's requests answered 503 while its model has no replica",
            )
            again = deploy("alpha")
            platform.wait_state(again, {"running"})
            back = len(outcomes)
            wait_for(lambda: "mine" in outcomes[back:], 30, what="alpha's model answering again")
        finally:
            stop.set()
            asking.join(30)
        assert "theirs" not in outcomes
        strays = [o for o in outcomes if o != "mine" and not o.startswith("503: model 'mnist'")]
        assert strays == [], strays[:5]
        assert ask("/v2/models/beta/mnist/infer", alpha) == "theirs"
