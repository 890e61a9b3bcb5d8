"""Multi-step EAGLE draft on the GPU, exact: every draft accepted, every output the rule.

Written by sglang-draft-layout (``apply``); ``sglang-draft-layout check`` reports it stale
when it differs from what the tool would write. Needs nothing but this tree: it builds a
tiny Llama target, its exact EAGLE draft and a tokenizer into a temporary folder (the
builder below is the tool's, embedded verbatim), starts this tree's server for every
configuration at once, and sends greedy requests, a batch of 8 near-context prompts
among them. The target's greedy output follows a fixed rule that the draft reproduces, so
every request's accept length is exactly num_steps + 1 (its length is a multiple of
num_steps + 1): a draft layout that loses a slot shows up as a shorter accept length or
a wrong token. SGLANG_DRAFT_LAYOUT_CONFIGS=name,name runs a subset of CONFIGS.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np
import requests
import torch

from sglang.srt.utils import kill_process_tree
from sglang.test.ci.ci_register import register_cuda_ci
from sglang.test.test_utils import CustomTestCase

register_cuda_ci(est_time=240, suite="stage-b-test-1-gpu-small")

# sglang-draft-layout: embed sglang_draft_layout.tiny_models


#: name: (attention backend, CUDA graphs, topk, num_steps)
CONFIGS = {
    "flashinfer_cg_k8s5": ("flashinfer", True, 8, 5),
    "flashinfer_nocg_k4s3": ("flashinfer", False, 4, 3),
    "flashinfer_cg_k1s5": ("flashinfer", True, 1, 5),
    "triton_nocg_k1s3": ("triton", False, 1, 3),
    "triton_nocg_k8s5": ("triton", False, 8, 5),
    "triton_cg_k4s3": ("triton", True, 4, 3),
}
SERVER_ARGS = [
    "--host", "127.0.0.1", "--tp-size", "1", "--mem-fraction-static", "0.08",
    "--max-total-tokens", "200000", "--skip-server-warmup",
    "--grammar-backend", "none", "--max-running-requests", "8",
]  # fmt: skip
BASE_PORT = 31000
STARTUP_TIMEOUT = 600
MIN_NEW_TOKENS = 64
NEAR_CONTEXT_BATCHES = 2


def selected_configs():
    """CONFIGS, or the names listed in SGLANG_DRAFT_LAYOUT_CONFIGS."""
    names = os.environ.get("SGLANG_DRAFT_LAYOUT_CONFIGS", "")
    picked = [name.strip() for name in names.split(",") if name.strip()]
    unknown = sorted(set(picked) - set(CONFIGS))
    if unknown:
        raise ValueError(f"unknown configurations {unknown}; known: {sorted(CONFIGS)}")
    return picked or list(CONFIGS)


def new_tokens(num_steps):
    """The smallest multiple of num_steps + 1 from MIN_NEW_TOKENS on."""
    return -(-MIN_NEW_TOKENS // (num_steps + 1)) * (num_steps + 1)


def server_command(models, port, backend, cuda_graph, topk, num_steps):
    """The launch_server command line of one configuration."""
    draft_tokens = num_steps + 1 if topk == 1 else 2 * num_steps + 2
    return [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", os.path.join(models, "target"), "--port", str(port),
        *SERVER_ARGS, "--attention-backend", backend,
        "--speculative-algorithm", "EAGLE",
        "--speculative-draft-model-path", os.path.join(models, "draft"),
        "--speculative-num-steps", str(num_steps),
        "--speculative-eagle-topk", str(topk),
        "--speculative-num-draft-tokens", str(draft_tokens),
        *(["--cuda-graph-max-bs", "8"] if cuda_graph else ["--disable-cuda-graph"]),
    ]  # fmt: skip


def request_plan(prompts):
    """(tag, prompts, rule continuations) of every request sent to each server."""
    short, rule = prompts["short"], prompts["expected_rule"]
    plan = [(f"short{i}", [text], [rule["short"][i]]) for i, text in enumerate(short)]
    plan.append(("short_batch", short, rule["short"]))
    near_context = [prompts["long_1900"]] * 8
    for batch in range(NEAR_CONTEXT_BATCHES):
        plan.append((f"near_context_batch{batch}", near_context, rule["long_1900"] * 8))
    return plan


def log_tail(path, lines=30):
    with open(path, errors="replace") as log:
        return "".join(log.readlines()[-lines:])


class TestDraftLayoutExact(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        cls.workdir = tempfile.mkdtemp(prefix="draft_layout_exact_")
        cls.servers = {}
        models = os.path.join(cls.workdir, "models")
        _tokenizer, cls.prompts = build_models(models)
        for index, name in enumerate(selected_configs()):
            port = BASE_PORT + 100 * index
            log_path = os.path.join(cls.workdir, f"server_{name}.log")
            with open(log_path, "w") as log:
                process = subprocess.Popen(
                    server_command(models, port, *CONFIGS[name]),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            cls.servers[name] = (process, port, log_path)
        cls.started = time.monotonic()
        cls.ready = {name: cls.wait_healthy(*cls.servers[name]) for name in cls.servers}

    @classmethod
    def wait_healthy(cls, process, port, log_path):
        """None once the server answers /health, else why it did not (with its log)."""
        while time.monotonic() - cls.started < STARTUP_TIMEOUT:
            if process.poll() is not None:
                return f"exited with {process.returncode}:\n{log_tail(log_path)}"
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=5).ok:
                    return None
            except requests.RequestException:
                pass
            time.sleep(1)
        return f"not healthy after {STARTUP_TIMEOUT} s:\n{log_tail(log_path)}"

    @classmethod
    def tearDownClass(cls):
        for process, _port, _log in getattr(cls, "servers", {}).values():
            kill_process_tree(process.pid)
        shutil.rmtree(cls.workdir, ignore_errors=True)

    def check_config(self, name):
        if name not in self.servers:
            self.skipTest(f"{name} not in SGLANG_DRAFT_LAYOUT_CONFIGS")
        process, port, log_path = self.servers[name]
        self.assertIsNone(self.ready[name], f"{name}: server {self.ready[name]}")
        _backend, _cuda_graph, _topk, num_steps = CONFIGS[name]
        length = new_tokens(num_steps)
        sampling = {"temperature": 0, "max_new_tokens": length, "ignore_eos": True}
        errors = []
        for tag, texts, rules in request_plan(self.prompts):
            response = requests.post(
                f"http://127.0.0.1:{port}/generate",
                json={"text": texts, "sampling_params": sampling},
                timeout=300,
            )
            self.assertEqual(
                response.status_code, 200, f"{name} {tag}: {response.text}"
            )
            for index, (output, rule) in enumerate(zip(response.json(), rules)):
                request = f"{name} {tag}[{index}]"
                if output["output_ids"] != rule[:length]:
                    errors.append(f"{request}: output differs from the rule")
                meta = output["meta_info"]
                verify_ct = meta.get("spec_verify_ct", 0)
                if meta["completion_tokens"] != (num_steps + 1) * verify_ct:
                    accept = meta["completion_tokens"] / max(verify_ct, 1)
                    errors.append(
                        f"{request}: accept length {accept:.3f} != {num_steps + 1} "
                        f"({meta['completion_tokens']} tokens in {verify_ct} verifies)"
                    )
        self.assertIsNone(process.poll(), f"{name}: server died\n{log_tail(log_path)}")
        if errors:
            self.fail(f"{len(errors)} requests off the rule:\n" + "\n".join(errors))

    def test_flashinfer_cg_k8s5(self):
        self.check_config("flashinfer_cg_k8s5")

    def test_flashinfer_nocg_k4s3(self):
        self.check_config("flashinfer_nocg_k4s3")

    def test_flashinfer_cg_k1s5(self):
        self.check_config("flashinfer_cg_k1s5")

    def test_triton_nocg_k1s3(self):
        self.check_config("triton_nocg_k1s3")

    def test_triton_nocg_k8s5(self):
        self.check_config("triton_nocg_k8s5")

    def test_triton_cg_k4s3(self):
        self.check_config("triton_cg_k4s3")


if __name__ == "__main__":
    unittest.main()
