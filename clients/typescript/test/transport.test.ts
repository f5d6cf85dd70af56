// The default transport (Node's `http` module) against real sockets: what a
// broken, refused or silent connection becomes, and a caller's own agent.
import { strict as assert } from "node:assert";
import {
  Agent,
  createServer as createHttpServer,
  type IncomingMessage,
  type Server as HttpServer,
  type ServerResponse,
} from "node:http";
import { createServer as createTcpServer, type AddressInfo, type Server } from "node:net";
import { describe, test } from "node:test";
import { Client, ConnectionError, RequestTimeoutError, newJobId } from "../src/index.js";

async function listening(server: Server): Promise<string> {
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

async function closed(server: Server): Promise<void> {
  await new Promise<void>((resolve) => server.close(() => resolve()));
}

/** An HTTP server answering each request with the next of `answers`. */
function scriptedServer(answers: Array<(request: IncomingMessage, response: ServerResponse) => void>): {
  server: HttpServer;
  paths: string[];
} {
  const paths: string[] = [];
  const server = createHttpServer((request, response) => {
    paths.push(`${request.method} ${request.url}`);
    request.resume();
    request.on("end", () => {
      const answer = answers.shift();
      if (answer === undefined) response.writeHead(500).end();
      else answer(request, response);
    });
  });
  return { server, paths };
}

const jobAnswer = (id: string) => (_request: IncomingMessage, response: ServerResponse) => {
  response.writeHead(201, { "content-type": "application/svc+json" });
  response.end(JSON.stringify({ job: { id, type: "a.b", queue: "default", args: [], meta: {}, state: "available" } }));
};

describe("the default transport", () => {
  test("a connection closed before the answer is a ConnectionError that may have been applied", async () => {
    let connections = 0;
    const server = createTcpServer((socket) => {
      connections++;
      socket.once("data", () => socket.destroy());
    });
    const url = await listening(server);
    try {
      const client = new Client(url, { retry: { baseDelayMs: 1, maxDelayMs: 2 } });
      const failure = await client.enqueue("a.b", []).then(() => undefined, (e: unknown) => e);
      assert.ok(failure instanceof ConnectionError, String(failure));
      assert.equal(failure.code, "connection_error");
      assert.equal(failure.maybeApplied, true);
      assert.equal(connections, 1, "an enqueue without id is not sent again");
    } finally {
      await closed(server);
    }
  });

  test("a refused connection is retried, then reported as refused", async () => {
    const server = createTcpServer();
    const url = await listening(server);
    await closed(server);
    const client = new Client(url, { retry: { maxRetries: 2, baseDelayMs: 1, maxDelayMs: 2 } });
    const failure = await client.enqueue("a.b", []).then(() => undefined, (e: unknown) => e);
    assert.ok(failure instanceof ConnectionError, String(failure));
    assert.equal(failure.code, "connection_refused");
    assert.equal(failure.attempts, 3);
    assert.equal(failure.maybeApplied, false);
  });

  test("a server that does not answer runs into the timeout", async () => {
    const { server } = scriptedServer([() => undefined]);
    const url = await listening(server);
    try {
      const client = new Client(url, { timeoutMs: 100, retry: { maxRetries: 0 } });
      const failure = await client.enqueue("a.b", []).then(() => undefined, (e: unknown) => e);
      assert.ok(failure instanceof RequestTimeoutError, String(failure));
      assert.equal(failure.maybeApplied, true);
    } finally {
      server.closeAllConnections();
      await closed(server);
    }
  });

  test("a caller's signal aborts the request", async () => {
    const { server } = scriptedServer([() => undefined]);
    const url = await listening(server);
    try {
      const client = new Client(url);
      const controller = new AbortController();
      const pending = client.enqueue("a.b", [], { signal: controller.signal }).then(() => undefined, (e: unknown) => e);
      setTimeout(() => controller.abort(new Error("changed my mind")), 20);
      const failure = await pending;
      assert.ok(failure instanceof Error);
      assert.equal(failure.message, "changed my mind");
    } finally {
      server.closeAllConnections();
      await closed(server);
    }
  });

  test("requests go through a given agent, on kept-alive sockets, and answer headers are read", async () => {
    const id = newJobId();
    const { server, paths } = scriptedServer([
      (_request, response) => {
        response.writeHead(429, { "content-type": "application/svc+json", "retry-after": "0" });
        response.end(JSON.stringify({ error: { code: "rate_limited", message: "slow down", retryable: true } }));
      },
      jobAnswer(id),
      jobAnswer(id),
    ]);
    let sockets = 0;
    server.on("connection", () => sockets++);
    const url = await listening(server);
    const agent = new Agent({ keepAlive: true });
    try {
      const client = new Client(url, { agent, retry: { baseDelayMs: 1, maxDelayMs: 2 } });
      assert.equal((await client.enqueue("a.b", [])).id, id, "the 429 is retried after its Retry-After");
      assert.equal((await client.enqueue("a.b", [])).id, id);
      assert.equal(Object.values(agent.freeSockets).flat().length, 1, "the socket is kept in the given agent");
      assert.deepEqual(paths, ["POST /svc/v1/jobs", "POST /svc/v1/jobs", "POST /svc/v1/jobs"]);
      assert.equal(sockets, 1, "one kept-alive socket for all three");
    } finally {
      agent.destroy();
      await closed(server);
    }
  });
});
