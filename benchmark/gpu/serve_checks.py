#!/usr/bin/env python3
"""Run `python3 -m sglang.launch_server` for several configurations at once, each on its own
port, with the unpatched or the patched SGLang tree first on PYTHONPATH; send greedy requests;
check outputs against the model's rule and accept lengths against num_steps + 1.

Servers start concurrently (startup is the slow part); their request phases run one at a time
(a lock), so the tokens/s of one configuration is measured with the others idle.

Config names:  BACKEND_CG_MODE[_TREE]
  BACKEND  triton | flashinfer | fimla (--attention-backend flashinfer on the DeepSeek MLA models of
           make_deepseek_models.py: SGLang picks FlashInferMLAAttnBackend for an MLA model) |
           dsv4 (the DeepSeek-V4 models of make_dsv4_models.py; 0.5.12 forces its dsv4 backend,
           page size 256, fp8 KV and spec v2 for them)
  CG       nocg (--disable-cuda-graph) | cg (--cuda-graph-max-bs 8) | cgbs1 (--cuda-graph-max-bs 1) |
           cgdef (CUDA graphs at SGLang's own max batch; memory_cost.py)
  MODE     nonspec | k{TOPK}s{STEPS}   e.g. k4s3 = EAGLE topk 4, 3 steps
  TREE     unpatched | patched         (nonspec runs on the unpatched tree)
Sets: see SETS below; `--list` prints them.

Results: OUT/results.json (every request: output ids, rule match, accept length, seconds),
OUT/summary.md (one table row per configuration), OUT/trace.txt (module origins per server),
server logs under --logdir.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
_SERVERS = []  # every Popen started; all are killed on exit (they run in their own sessions)

SETS = {
    # the case the patch exists for in CUDA-graph mode: flashinfer's graph kv_indices row
    "key": ["flashinfer_cg_k4s3_unpatched", "flashinfer_cg_k4s3_patched", "flashinfer_cg_nonspec"],
    "triton_nocg": [
        "triton_nocg_k1s3_unpatched",
        "triton_nocg_k1s3_patched",
        "triton_nocg_k4s3_unpatched",
        "triton_nocg_k4s3_patched",
        "triton_nocg_nonspec",
    ],
    "flashinfer_nocg": [
        "flashinfer_nocg_k1s3_unpatched",
        "flashinfer_nocg_k1s3_patched",
        "flashinfer_nocg_k4s3_unpatched",
        "flashinfer_nocg_k4s3_patched",
        "flashinfer_nocg_nonspec",
    ],
    "steps": [
        "triton_nocg_k1s1_unpatched",
        "triton_nocg_k1s1_patched",
        "flashinfer_cg_k4s5_unpatched",
        "flashinfer_cg_k4s5_patched",
        "triton_nocg_k4s5_unpatched",
        "triton_nocg_k4s5_patched",
    ],
}
# DeepSeek (run_deepseek_on_h200.sh, --models from make_deepseek_models.py): FlashInfer-MLA, topk 1
# (0.5.12 refuses topk > 1 for MLA drafts), 3 steps, NextN draft. Not part of "all".
DEEPSEEK_SETS = {
    "dsmla": [
        "fimla_nocg_k1s3_unpatched",
        "fimla_nocg_k1s3_patched",
        "fimla_cg_k1s3_unpatched",
        "fimla_cg_k1s3_patched",
        "fimla_nocg_nonspec",
    ],
    # DeepSeek-V4 (0.5.12 allows topk 1 only): the --disable-cuda-graph case of change A first
    "dsv4_nocg": ["dsv4_nocg_k1s3_unpatched", "dsv4_nocg_k1s3_patched", "dsv4_nocg_nonspec"],
    "dsv4_cg": ["dsv4_cg_k1s3_unpatched", "dsv4_cg_k1s3_patched"],
    # control: one draft step has one out_cache_loc slot per request, so unpatched must serve there
    "dsv4_steps": [
        "dsv4_nocg_k1s1_unpatched",
        "dsv4_nocg_k1s1_patched",
        "dsv4_nocg_k1s5_unpatched",
        "dsv4_nocg_k1s5_patched",
        "dsv4_cg_k1s5_unpatched",
        "dsv4_cg_k1s5_patched",
        "dsv4_nocg_nonspec",
    ],
}
DEEPSEEK_SETS["dsv4"] = DEEPSEEK_SETS["dsv4_nocg"] + DEEPSEEK_SETS["dsv4_cg"]
SETS["first"] = SETS["key"] + SETS["triton_nocg"]
SETS["second"] = SETS["flashinfer_nocg"] + SETS["steps"]
SETS["all"] = SETS["first"] + SETS["second"]
SETS.update(DEEPSEEK_SETS)
# --attention-backend value of each BACKEND in a config name
ATTENTION_BACKEND = {"triton": "triton", "flashinfer": "flashinfer", "fimla": "flashinfer", "dsv4": "dsv4"}
# Environment a BACKEND's servers need. dsv4: the models are unquantised bf16, and 0.5.12 asserts an
# fp8 scale on wo_a unless SGLANG_OPT_FP8_WO_A_GEMM is off; its experts default to mxfp4.
# SGL_DL_FLASHMLA_LEGACY: see trace/sitecustomize.py (sgl-flash-mla 1.0.0 keeps V4 and SM90 on its
# legacy kernels).
BACKEND_ENV = {
    "dsv4": {"SGLANG_OPT_FP8_WO_A_GEMM": "0", "SGLANG_DSV4_FP4_EXPERTS": "0", "SGL_DL_FLASHMLA_LEGACY": "V4"}
}


def parse(name):
    parts = name.split("_")
    backend, cg, mode = parts[0], parts[1], parts[2]
    tree = parts[3] if len(parts) > 3 else "unpatched"
    assert backend in ATTENTION_BACKEND and cg in ("cg", "nocg", "cgbs1", "cgdef"), name
    assert tree in ("unpatched", "patched"), name
    if mode == "nonspec":
        topk = steps = None
    else:
        assert mode[0] == "k" and "s" in mode, name
        topk, steps = (int(x) for x in mode[1:].split("s"))
    return dict(backend=backend, cg=cg, topk=topk, steps=steps, tree=tree)


MIN_NEW_TOKENS = 64
NONSPEC_NEW_TOKENS = 72  # >= every spec request (steps 1..8), so the non-spec output is a reference for all


def max_new_tokens(steps):
    """Request length: the smallest multiple of num_steps + 1 from MIN_NEW_TOKENS on, so that an
    exact draft gives accept length num_steps + 1 for every step count (64 for 1, 3, 7 steps,
    66 for 2, 5, 65 for 4, 70 for 6, 72 for 8)."""
    if steps is None:
        return NONSPEC_NEW_TOKENS
    return -(-MIN_NEW_TOKENS // (steps + 1)) * (steps + 1)


def draft_tokens(topk, steps):
    return steps + 1 if topk == 1 else {1: 4, 2: 6, 3: 8, 4: 10, 5: 12}.get(steps, 2 * steps + 2)


def server_cmd(cfg, models, port, a):
    cmd = [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        f"{models}/target",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--tp",
        "1",
        "--mem-fraction-static",
        str(a.mem_fraction),
        "--skip-server-warmup",
        "--grammar-backend",
        "none",
        "--attention-backend",
        ATTENTION_BACKEND[cfg["backend"]],
        "--log-level",
        "info",
    ]
    # a token cap and a request cap, unless the caller leaves them to SGLang (None: memory_cost.py)
    if a.max_total_tokens is not None:
        cmd += ["--max-total-tokens", str(a.max_total_tokens)]
    if getattr(a, "max_running_requests", 8) is not None:
        cmd += ["--max-running-requests", str(getattr(a, "max_running_requests", 8))]
    if cfg["topk"] is not None:
        cmd += [
            "--speculative-algorithm",
            "EAGLE",
            "--speculative-draft-model-path",
            f"{models}/draft",
            "--speculative-num-steps",
            str(cfg["steps"]),
            "--speculative-eagle-topk",
            str(cfg["topk"]),
            "--speculative-num-draft-tokens",
            str(draft_tokens(cfg["topk"], cfg["steps"])),
        ]
    cmd += {
        "nocg": ["--disable-cuda-graph"],
        "cg": ["--cuda-graph-max-bs", "8"],
        "cgbs1": ["--cuda-graph-max-bs", "1"],
        "cgdef": [],
    }[cfg["cg"]]
    cmd += a.extra_args.split()
    return cmd


def server_env(cfg, a, trace_file):
    env = dict(os.environ)
    path = [os.path.join(HERE, "trace")]
    if cfg["tree"] == "patched":
        path.append(a.patched)
    path.append(a.site)
    if env.get("PYTHONPATH"):
        path += [p for p in env["PYTHONPATH"].split(":") if p and p not in path]
    env["PYTHONPATH"] = ":".join(path)
    env["SGL_DL_TRACE"] = trace_file
    env.update(BACKEND_ENV.get(cfg["backend"], {}))
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def http(port, path, payload=None, timeout=180):
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=data, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, json.loads(r.read().decode() or "null")


def kill_group(p):
    if p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=20)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass


def error_lines(path, keep=12):
    """The last lines of a server log that name an error (a failed server's reason)."""
    words = ("Error", "error:", "Traceback", "assert", "Exception", "Killed", "CUDA")
    try:
        with open(path, errors="replace") as f:
            lines = [l.rstrip()[:600] for l in f if any(w in l for w in words)]
    except OSError:
        return []
    return lines[-keep:]


def request_plan(prompts, stress):
    """(tag, text or list of texts, expected ids or list) in the recipe's order."""
    exp = prompts["expected_rule"]
    plan = [(f"short{i}", t, exp["short"][i]) for i, t in enumerate(prompts["short"])]
    plan.append(("batch5", prompts["short"], exp["short"]))
    plan.append(("long1k", prompts["long_1k"], exp["long_1k"][0]))
    plan.append(("long1900", prompts["long_1900"], exp["long_1900"][0]))
    plan.append(
        (
            "batch_long",
            [prompts["long_1900"]] * 4 + [prompts["long_1k"]],
            [exp["long_1900"][0]] * 4 + [exp["long_1k"][0]],
        )
    )
    for rep in range(stress):
        plan.append((f"stress8x1900_{rep}", [prompts["long_1900"]] * 8, [exp["long_1900"][0]] * 8))
    return plan


class Runner:
    def __init__(self, a, prompts):
        self.a = a
        self.prompts = prompts
        self.t0 = time.time()
        self.lock = threading.Lock()
        self.results = {}
        self.save_lock = threading.Lock()

    def left(self):
        return self.a.deadline_s - (time.time() - self.t0)

    def save(self):
        with self.save_lock:
            ordered = [self.results[n] for n in self.a.configs if n in self.results]
            json.dump(ordered, open(os.path.join(self.a.out, "results.json"), "w"), indent=1)

    def run(self, name, port):
        cfg = parse(name)
        a = self.a
        res = {"config": name, **cfg, "port": port, "ok": False, "status": "started"}
        self.results[name] = res
        trace = os.path.join(a.logdir, f"trace_{name}.txt")
        open(trace, "w").close()
        cmd = server_cmd(cfg, a.models, port, a)
        res["cmd"] = "python3 " + " ".join(cmd[1:])
        env = server_env(cfg, a, trace)
        res["pythonpath"] = env["PYTHONPATH"]
        t0 = time.time()
        log = open(os.path.join(a.logdir, f"server_{name}.log"), "w")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        _SERVERS.append(p)
        try:
            ready = False
            while time.time() - t0 < a.startup_timeout and self.left() > 0:
                if p.poll() is not None:
                    res["error"] = f"server exited rc={p.returncode} during startup"
                    break
                try:
                    if http(port, "/health", timeout=5)[0] == 200:
                        ready = True
                        break
                except Exception:
                    pass
                time.sleep(1)
            res["startup_s"] = round(time.time() - t0, 1)
            if not ready:
                res.setdefault("error", "not healthy before startup timeout / deadline")
                res["status"] = "no server"
                return
            res["status"] = "healthy, waiting for its request turn"
            self.save()
            with self.lock:
                if self.left() < 20:
                    res["status"] = "not run: deadline reached before its request turn"
                    return
                res["status"] = "requests"
                self.requests(res, cfg, port, p)
            res["status"] = "done"
        except Exception as e:  # keep the other configs going
            res["error"] = repr(e)
        finally:
            res["alive_after"] = p.poll() is None
            kill_group(p)
            log.close()
            if not res["ok"]:
                res["log_errors"] = error_lines(os.path.join(a.logdir, f"server_{name}.log"))
            res["total_s"] = round(time.time() - t0, 1)
            res["trace"] = sorted(set(l.split(" ", 1)[1].strip() for l in open(trace) if " " in l))
            self.save()

    def requests(self, res, cfg, port, p):
        n = max_new_tokens(cfg["steps"])
        sp = {"temperature": 0, "max_new_tokens": n, "ignore_eos": True}
        checks = []
        t_all = time.time()
        for tag, text, expected in request_plan(self.prompts, self.a.stress):
            if self.left() < 10:
                res["truncated"] = "deadline"
                break
            if p.poll() is not None:
                res["error"] = f"server died rc={p.returncode} before {tag}"
                break
            t1 = time.time()
            try:
                _, out = http(port, "/generate", {"text": text, "sampling_params": sp})
            except Exception as e:
                checks.append({"tag": tag, "error": repr(e), "match_rule": False})
                continue
            dt = time.time() - t1
            outs = out if isinstance(out, list) else [out]
            exps = expected if isinstance(text, list) else [expected]
            for j, (o, e) in enumerate(zip(outs, exps)):
                ids = o.get("output_ids") or []
                e = e[:n]
                mi = o.get("meta_info", {})
                diff = (
                    None
                    if ids == e
                    else next((k for k, (x, y) in enumerate(zip(ids, e)) if x != y), min(len(ids), len(e)))
                )
                checks.append(
                    {
                        "tag": f"{tag}[{j}]",
                        "match_rule": ids == e,
                        "first_diff": diff,
                        "n_out": len(ids),
                        "accept_len": mi.get("spec_accept_length"),
                        "verify_ct": mi.get("spec_verify_ct"),
                        "batch_secs": round(dt, 3),
                        "batch_size": len(outs),
                        "output_ids": ids,
                    }
                )
        res["requests_s"] = round(time.time() - t_all, 2)
        res["checks"] = checks
        res["max_new_tokens"] = n
        try:
            _, info = http(port, "/get_server_info", timeout=30)
            st = info.get("internal_states", [{}])
            res["internal_states"] = [
                {k: v for k, v in s.items() if "spec" in k or "accept" in k}
                for s in (st if isinstance(st, list) else [st])
            ]
        except Exception as e:
            res["server_info_error"] = repr(e)
        res["ok"] = bool(checks) and "error" not in res
        summarize(res, cfg)


def summarize(res, cfg):
    checks = res.get("checks", [])
    res["all_match_rule"] = bool(checks) and all(c.get("match_rule") for c in checks)
    accs = [c["accept_len"] for c in checks if c.get("accept_len") is not None]
    if accs:
        res["accept_min"], res["accept_max"] = min(accs), max(accs)
        res["accept_mean"] = round(sum(accs) / len(accs), 4)
        res["accept_all_exact"] = all(abs(x - (cfg["steps"] + 1)) < 1e-9 for x in accs)
    # tokens/s. "all": every completion token over the summed request wall time, warm-up
    # (first request of each shape: JIT compiles) included. "single": median of short1..short4
    # (one request of max_new_tokens; short0 is the warm-up). "batch8": the last 8-request
    # near-context batch (8 x n tokens over its wall time).
    seen, tok, secs = set(), 0, 0.0
    for c in checks:
        base = c["tag"].split("[")[0]
        tok += c.get("n_out", 0)
        if base not in seen and "batch_secs" in c:
            seen.add(base)
            secs += c["batch_secs"]
    res["tokens_per_s"] = round(tok / secs, 1) if secs else None
    single = [
        c["n_out"] / c["batch_secs"]
        for c in checks
        if c["tag"].startswith("short")
        and not c["tag"].startswith("short0")
        and c.get("batch_size") == 1
        and c.get("batch_secs")
    ]
    res["single_stream_tokens_per_s"] = round(statistics.median(single), 1) if single else None
    stress = sorted({c["tag"].split("[")[0] for c in checks if c["tag"].startswith("stress")})
    if stress:
        last = [c for c in checks if c["tag"].split("[")[0] == stress[-1]]
        res["batch8_tokens_per_s"] = (
            round(sum(c.get("n_out", 0) for c in last) / last[0]["batch_secs"], 1)
            if last and last[0].get("batch_secs")
            else None
        )


def compare_with_nonspec(results):
    """For every spec request, whether its output equals the non-spec server's (same backend if run)."""
    nonspec = {r["config"]: r for r in results if r.get("topk") is None and r.get("checks")}
    for r in results:
        if r.get("topk") is None or not r.get("checks"):
            continue
        same_backend = [n for n in nonspec if n.startswith(r["backend"] + "_")]
        ref_name = (same_backend or list(nonspec) or [None])[0]
        if ref_name is None:
            r["equal_nonspec"] = None
            continue
        ref = {c["tag"]: c["output_ids"] for c in nonspec[ref_name]["checks"] if "output_ids" in c}
        eq = [
            c["output_ids"] == ref[c["tag"]][: len(c["output_ids"])]
            for c in r["checks"]
            if c["tag"] in ref and "output_ids" in c
        ]
        r["equal_nonspec"] = bool(eq) and all(eq)
        r["equal_nonspec_ref"] = ref_name
        r["equal_nonspec_n"] = len(eq)


def origin_note(r):
    """Where spec_utils came from in this server's processes (from the import trace)."""
    su = [t.split(" ", 1)[1] for t in r.get("trace", []) if t.startswith("sglang.srt.speculative.spec_utils ")]
    return ", ".join(sorted(set(os.path.dirname(os.path.dirname(os.path.dirname(x))) for x in su))) or "-"


def write_summary(results, path, a):
    rows = [
        "| config | tree | startup s | requests | outputs = rule | = non-spec | accept len min / max "
        "(expected) | tokens/s single | tokens/s batch of 8 | tokens/s all | alive | sglang.srt from | status |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        n = len(r.get("checks", []))
        exp = "-" if r.get("topk") is None else f"{r['steps'] + 1}"
        acc = "-" if "accept_min" not in r else f"{r['accept_min']:.3f} / {r['accept_max']:.3f} ({exp})"
        rows.append(
            f"| {r['config']} | {r['tree']} | {r.get('startup_s')} | {n} | {r.get('all_match_rule')} | "
            f"{r.get('equal_nonspec', '-')} | {acc} | {r.get('single_stream_tokens_per_s')} | "
            f"{r.get('batch8_tokens_per_s')} | {r.get('tokens_per_s')} | {r.get('alive_after')} | {origin_note(r)} | "
            f"{r.get('status')}{' ' + r['error'] if r.get('error') else ''} |"
        )
    with open(path, "w") as f:
        f.write("\n".join(rows) + "\n")
    return "\n".join(rows)


def kill_all(*_):
    """SIGTERM every server's process group, then SIGKILL what is left after 10 s."""
    live = [p for p in _SERVERS if p.poll() is None]
    for p in live:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    end = time.time() + 10
    while time.time() < end and any(p.poll() is None for p in live):
        time.sleep(0.5)
    for p in live:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main():
    signal.signal(signal.SIGTERM, lambda *_: (kill_all(), sys.exit(143)))
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", required=True)
    ap.add_argument("--site", required=True, help="folder holding the unpatched sglang/ (and its deps)")
    ap.add_argument("--patched", required=True, help="folder holding the patched copy sglang/")
    ap.add_argument("--out", required=True)
    ap.add_argument("--logdir", default=None)
    ap.add_argument("--base-port", type=int, default=10000)
    ap.add_argument("--port-step", type=int, default=1200)
    ap.add_argument("--mem-fraction", type=float, default=0.08)
    ap.add_argument("--max-total-tokens", type=int, default=200000)
    ap.add_argument("--stress", type=int, default=2, help="batches of 8 near-context prompts")
    ap.add_argument("--startup-timeout", type=int, default=480)
    ap.add_argument("--deadline-s", type=float, default=1e9, help="stop everything this many s after start")
    ap.add_argument("--stagger-s", type=float, default=2.0, help="delay between server launches")
    ap.add_argument("--extra-args", default=os.environ.get("EXTRA_ARGS", ""))
    ap.add_argument("--list", action="store_true")
    ap.add_argument("configs", nargs="*")
    a = ap.parse_args()
    if a.list:
        for k, v in SETS.items():
            print(k, " ".join(v))
        return 0
    names = []
    for c in a.configs or ["all"]:
        for n in SETS.get(c, [c]):
            if n not in names:
                parse(n)
                names.append(n)
    a.configs = names
    os.makedirs(a.out, exist_ok=True)
    a.logdir = a.logdir or os.path.join(a.out, "logs")
    os.makedirs(a.logdir, exist_ok=True)
    prompts = json.load(open(os.path.join(a.models, "prompts.json")))
    runner = Runner(a, prompts)
    threads = []
    for i, n in enumerate(names):
        th = threading.Thread(target=runner.run, args=(n, a.base_port + i * a.port_step), daemon=True)
        th.start()
        threads.append(th)
        time.sleep(a.stagger_s)
    last = time.time()
    while any(t.is_alive() for t in threads):
        time.sleep(2)
        if time.time() - last > 30:
            last = time.time()
            st = {n: runner.results.get(n, {}).get("status") for n in names}
            print(f"[{time.time() - runner.t0:5.0f}s] " + ", ".join(f"{n}:{s}" for n, s in st.items()), flush=True)
        if runner.left() < -30:
            print("deadline passed; abandoning remaining threads", flush=True)
            break
    kill_all()
    results = [runner.results[n] for n in names if n in runner.results]
    compare_with_nonspec(results)
    json.dump(results, open(os.path.join(a.out, "results.json"), "w"), indent=1)
    print(write_summary(results, os.path.join(a.out, "summary.md"), a))
    for r in results:
        bad = [c["tag"] for c in r.get("checks", []) if not c.get("match_rule")]
        accs = [(c["tag"], c.get("accept_len")) for c in r.get("checks", [])]
        print(f"{r['config']}: mismatches={bad} accept={accs if r.get('topk') else '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
