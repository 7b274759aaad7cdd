"""A remote reward against an HTTP server this test starts on 127.0.0.1: the JSON batch it receives, the
rewards it returns, and each way the call can fail (error status, bad body, wrong length, too slow, no
server), counted and scored `wrong` like a local function's failures."""

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from dapo_jax.rewards.custom import CustomRewardError, make_custom_reward
from dapo_jax.rewards.remote import RemoteReward

RECEIVED = []


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        RECEIVED.append((self.path, body))
        n = len(body["responses"])
        if self.path == "/slow":
            time.sleep(2.0)
        if self.path == "/error":
            self.send_error(500, "broken verifier")
            return
        answer = {
            "/score": lambda: {"rewards": [float(r == t) + row["level"] for r, t, row in
                                           zip(body["responses"], body["ground_truths"], body["rows"])]},
            "/bare": lambda: [0.5] * n,
            "/short": lambda: {"rewards": [1.0] * (n - 1)},
            "/nan": lambda: {"rewards": [None] * n},
            "/slow": lambda: {"rewards": [1.0] * n},
        }.get(self.path, lambda: None)()
        data = b"not json" if self.path == "/text" else json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def remote(url, **options):
    return make_custom_reward(url, options, wrong=-1.0, say=lambda msg: None)


def test_the_batch_goes_out_as_json_and_the_rewards_come_back(server):
    RECEIVED.clear()
    reward = remote(f"{server}/score", batch_size=2)
    rows = [{"level": 1, "q": "a"}, {"level": 2, "q": "b"}, {"level": 3, "q": "c"}]
    rewards, failed = reward.score_rows(["4", "5", "6"], ["4", "0", "6"], rows=rows, prompts=["pa", "pb", "pc"])
    assert failed == {}
    np.testing.assert_allclose(rewards, [2.0, 2.0, 4.0])
    bodies = sorted((b for _, b in RECEIVED), key=lambda b: b["prompts"])
    assert len(bodies) == 2  # batch_size=2: two POSTs
    assert bodies[0] == {"prompts": ["pa", "pb"], "responses": ["4", "5"], "ground_truths": ["4", "0"],
                         "rows": [{"level": 1, "q": "a"}, {"level": 2, "q": "b"}]}
    assert remote(f"{server}/bare").score_rows(["x"], ["y"])[0].tolist() == [0.5]  # a bare list is accepted


@pytest.mark.parametrize("path, why", [
    ("/error", "answered HTTP 500"),
    ("/text", "something that is not JSON"),
    ("/short", "returned 1 values for 2 responses"),
    ("/nan", "returned None"),
    ("/slow", "timed out after 0.3s"),
])
def test_a_failed_call_scores_its_rows_wrong(server, path, why):
    reward = remote(f"{server}{path}", timeout_s=0.3)
    rewards, failed = reward.score_rows(["a", "b"], ["1", "2"])
    assert rewards.tolist() == [-1.0, -1.0]
    assert set(failed) == {0, 1} and all(why in w for w in failed.values()), failed


def test_no_server_is_a_failure_not_a_crash():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rewards, failed = remote(f"http://127.0.0.1:{port}/score", timeout_s=2).score_rows(["a"], ["1"])
    assert rewards.tolist() == [-1.0] and "unreachable" in failed[0]


def test_refusals():
    with pytest.raises(ValueError, match="starts with http"):
        RemoteReward("ftp://127.0.0.1/x")
    with pytest.raises(CustomRewardError, match="leave options.form out"):
        make_custom_reward("http://127.0.0.1:1/x", {"form": "sample"}, wrong=0.0)
