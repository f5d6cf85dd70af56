import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
/** The repository root: build/test -> build -> clients/typescript -> clients -> root. */
export const repoRoot = resolve(here, "../../../..");
/** The svc binary: `SVC_BIN`, else the release build of this repository. */
export const svcBin = process.env["SVC_BIN"] ?? join(repoRoot, "target/release/svc");

export function freePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const server = createServer();
    server.unref();
    server.on("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      if (address === null || typeof address === "string") return reject(new Error("no port"));
      const port = address.port;
      server.close(() => resolvePort(port));
    });
  });
}

export const delay = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Polls `check` until it answers true, or fails after `timeoutMs`. */
export async function eventually(
  check: () => boolean | Promise<boolean>,
  timeoutMs = 10_000,
  what = "condition",
): Promise<void> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    if (await check()) return;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await delay(50);
  }
}

/** One svc server for a test file: started on a free port and a temporary data dir. */
export class TestServer {
  readonly dataDir: string;
  port = 0;
  private process: ChildProcess | undefined;
  private log = "";

  private readonly args: string[] = [];

  constructor(config?: string) {
    this.dataDir = mkdtempSync(join(tmpdir(), "svc-client-ts-"));
    if (config !== undefined) {
      const file = join(this.dataDir, "svc.toml");
      writeFileSync(file, config);
      this.args.push("--config", file);
    }
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  /** Starts a server; `config` is the text of a TOML settings file. */
  static async start(config?: string): Promise<TestServer> {
    const server = new TestServer(config);
    server.port = await freePort();
    await server.launch();
    return server;
  }

  /** Starts the binary (again) on the same port and data dir, and waits for health. */
  async launch(): Promise<void> {
    const child = spawn(svcBin, ["serve", "--listen", `127.0.0.1:${this.port}`, "--data-dir", this.dataDir, ...this.args], {
      stdio: ["ignore", "ignore", "pipe"],
    });
    this.process = child;
    child.stderr?.on("data", (chunk: Buffer) => {
      this.log = (this.log + chunk.toString()).slice(-20_000);
    });
    const exited = new Promise<never>((_, reject) =>
      child.once("exit", (code) => reject(new Error(`svc exited with ${code} at start:\n${this.log}`))),
    );
    exited.catch(() => {});
    const end = Date.now() + 15_000;
    for (;;) {
      try {
        const response = await Promise.race([fetch(`${this.url}/svc/v1/health`), exited]);
        await response.arrayBuffer();
        if (response.ok) return;
      } catch (error) {
        if (child.exitCode !== null) throw error;
      }
      if (Date.now() > end) throw new Error(`svc did not become healthy:\n${this.log}`);
      await delay(50);
    }
  }

  /** SIGKILL: no drain, no snapshot. */
  async kill(): Promise<void> {
    await this.signal("SIGKILL");
  }

  /** Sends a signal and waits for the process to exit. */
  async signal(signal: NodeJS.Signals): Promise<void> {
    const child = this.process;
    if (child === undefined || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((r) => child.once("exit", () => r()));
    child.kill(signal);
    await exited;
  }

  async stop(): Promise<void> {
    await this.signal("SIGKILL");
    rmSync(this.dataDir, { recursive: true, force: true });
  }
}
