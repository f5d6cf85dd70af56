// Jobs per second through the worker loop: batch-enqueues N no-op jobs, then
// times a Worker (concurrency 32 by default) draining them, and counts the
// worker's requests.
//
//   npm run build && node bench.mjs [--url http://127.0.0.1:8080] [--jobs 20000] [--concurrency 32]
//
// Without --url (or SVC_URL) it starts $SVC_BIN (default target/release/svc)
// on a free port with a temporary data dir, and stops it afterwards.
import { spawn } from "node:child_process";
import { Agent } from "node:http";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { Client, Worker, silentLogger } from "./dist/index.js";

const { values } = parseArgs({
  options: {
    url: { type: "string" },
    jobs: { type: "string", default: "20000" },
    concurrency: { type: "string", default: "32" },
    queue: { type: "string", default: "bench" },
  },
});
const total = Number(values.jobs);
const concurrency = Number(values.concurrency);
const queue = values.queue;

async function freePort() {
  return new Promise((ok, fail) => {
    const server = createServer();
    server.on("error", fail);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => ok(port));
    });
  });
}

let child;
let dataDir;
let url = values.url ?? process.env.SVC_URL;
if (url === undefined) {
  const root = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
  const bin = process.env.SVC_BIN ?? join(root, "target/release/svc");
  const port = await freePort();
  dataDir = mkdtempSync(join(tmpdir(), "svc-bench-"));
  url = `http://127.0.0.1:${port}`;
  child = spawn(bin, ["serve", "--listen", `127.0.0.1:${port}`, "--data-dir", dataDir], { stdio: "ignore" });
  for (let i = 0; ; i++) {
    try {
      if ((await fetch(`${url}/svc/v1/health`)).ok) break;
    } catch {}
    if (i > 200) throw new Error(`svc did not start (${bin})`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

try {
  const client = new Client(url);
  const enqueueStart = performance.now();
  for (let done = 0; done < total; ) {
    const n = Math.min(5_000, total - done);
    await client.enqueueBatch(Array.from({ length: n }, (_, i) => ({ type: "bench.noop", args: [done + i], queue })));
    done += n;
  }
  const enqueueSeconds = (performance.now() - enqueueStart) / 1000;

  let handled = 0;
  let resolveDone;
  const allDone = new Promise((r) => (resolveDone = r));
  let requests = 0;
  // Counts the requests the worker sends, through the agent they go through.
  class CountingAgent extends Agent {
    addRequest(request, options) {
      requests++;
      return super.addRequest(request, options);
    }
  }
  const agent = new CountingAgent({ keepAlive: true });
  const worker = new Worker(url, { queues: [queue], concurrency, handleSignals: false, logger: silentLogger, agent });
  worker.handle("bench.noop", () => {
    if (++handled === total) resolveDone();
  });
  const start = performance.now();
  const run = worker.run();
  await allDone;
  await worker.stop();
  await run;
  const seconds = (performance.now() - start) / 1000;
  console.log(`enqueued ${total} jobs in ${enqueueSeconds.toFixed(2)} s (${Math.round(total / enqueueSeconds)} jobs/s, batches of 5000)`);
  console.log(
    `drained ${total} jobs at concurrency ${concurrency} in ${seconds.toFixed(2)} s: ${Math.round(total / seconds)} jobs/s, ${requests} requests`,
  );
} finally {
  if (child) {
    child.kill("SIGKILL");
    rmSync(dataDir, { recursive: true, force: true });
  }
}
