"""A stand-in for ``python -m sglang.launch_server`` on CPU, answering as the H200 did.

Reads the command with SGLang's own ServerArgs parser, serves /health and /generate (text
or a list of texts; greedy output = the tiny models' rule continuation from prompts.json
beside the target). Accept length: num_steps + 1 for every request, except on a tree
without the helpers (unpatched) for FlashInfer with CUDA graphs and topk 8 on a batch of
8, where the H200 measured about 3.6: the verify count of completion_tokens / 3.6.
"""

import argparse
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative import spec_utils

parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
args = parser.parse_args()
with open(os.path.join(os.path.dirname(args.model_path), "prompts.json")) as f:
    prompts = json.load(f)
rule = dict(zip(prompts["short"], prompts["expected_rule"]["short"]))
rule[prompts["long_1900"]] = prompts["expected_rule"]["long_1900"][0]
patched = hasattr(spec_utils, "draft_kv_indices_buffer_width")
faulty_config = (args.attention_backend, args.disable_cuda_graph, args.speculative_eagle_topk) == (
    "flashinfer",
    False,
    8,
)


def generate(texts, max_new_tokens):
    steps = args.speculative_num_steps
    verify_ct = max_new_tokens // (steps + 1)
    if not patched and faulty_config and len(texts) == 8:
        verify_ct = round(max_new_tokens / 3.6)
    return [
        {
            "output_ids": rule[text][:max_new_tokens],
            "meta_info": {"completion_tokens": max_new_tokens, "spec_verify_ct": verify_ct},
        }
        for text in texts
    ]


class Handler(BaseHTTPRequestHandler):
    def reply(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.reply({})

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        texts = request["text"] if isinstance(request["text"], list) else [request["text"]]
        outputs = generate(texts, request["sampling_params"]["max_new_tokens"])
        self.reply(outputs if isinstance(request["text"], list) else outputs[0])


ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()
