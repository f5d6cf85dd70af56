import { strict as assert } from "node:assert";
import { randomBytes } from "node:crypto";
import { after, before, test } from "node:test";
import { AuthError, Client, Worker, silentLogger } from "../src/index.js";
import { TestServer, eventually } from "./helpers.js";

const keys = {
  admin: randomBytes(24).toString("hex"),
  producer: randomBytes(24).toString("hex"),
  worker: randomBytes(24).toString("hex"),
};
let server: TestServer;

before(async () => {
  const config = Object.entries(keys)
    .map(([role, key]) => `[[auth.keys]]\nname = "${role}-key"\nrole = "${role}"\nkey = "${key}"\n`)
    .join("\n");
  server = await TestServer.start(config);
});
after(async () => {
  await server.stop();
});

test("API keys: each role reaches its routes; others get AuthError", async () => {
  const producer = new Client(server.url, { apiKey: keys.producer });
  const admin = new Client(server.url, { apiKey: keys.admin });
  const job = await producer.enqueue("auth.job", [1], { queue: "auth" });

  const forbidden = await producer.queues.stats("auth").then(() => undefined, (e: unknown) => e);
  assert.ok(forbidden instanceof AuthError);
  assert.equal(forbidden.status, 403);
  assert.equal(forbidden.details["role"], "producer");

  const anonymous = await new Client(server.url).get(job.id).then(() => undefined, (e: unknown) => e);
  assert.ok(anonymous instanceof AuthError);
  assert.equal(anonymous.status, 401);

  const worker = new Worker(server.url, {
    apiKey: keys.worker,
    queues: ["auth"],
    handleSignals: false,
    logger: silentLogger,
  });
  worker.handle<[number]>("auth.job", ([n]) => n + 1);
  const run = worker.run();
  await eventually(async () => (await admin.get(job.id)).state === "completed");
  await worker.stop();
  await run;
  assert.equal((await admin.get(job.id)).result, 2);
});

test("a worker whose key is refused stops: run() rejects with AuthError", async () => {
  const worker = new Worker(server.url, {
    apiKey: keys.producer,
    queues: ["auth"],
    handleSignals: false,
    logger: silentLogger,
  });
  await assert.rejects(worker.run(), AuthError);
});
