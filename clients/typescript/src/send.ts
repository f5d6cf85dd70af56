/**
 * How one HTTP request leaves: through Node's own `http`/`https` modules on
 * kept-alive sockets by default, or through a `fetch` the caller gives.
 *
 * Node's `http` module is the default because it costs a fraction of the
 * built-in `fetch` per request (the worker loop's requests are where the
 * client spends its time; see the README's section on speed). Both are
 * part of Node, so the package still has no runtime dependency.
 */
import * as http from "node:http";
import * as https from "node:https";

/** One request, ready to send. */
export interface Outgoing {
  method: string;
  url: string;
  headers: Record<string, string>;
  body: string | undefined;
  /** Aborts the request (the caller's signal and its timeout, combined). */
  signal: AbortSignal;
}

/** A complete answer: status, headers and the whole body as text. */
export interface Incoming {
  status: number;
  headers: Headers;
  text: string;
}

/** Sends a request and reads its whole answer; throws what the network threw. */
export type Send = (request: Outgoing) => Promise<Incoming>;

/** A `Send` over a `fetch` function. */
export function fetchSend(fetchImpl: typeof fetch): Send {
  return async ({ method, url, headers, body, signal }) => {
    const response = await fetchImpl(url, { method, headers, body, signal });
    const text = await response.text();
    return { status: response.status, headers: response.headers, text };
  };
}

/**
 * How long an idle kept-alive socket stays open: well under the server's own
 * idle limit, so that a request is not sent on a socket the server is
 * closing at that moment.
 */
const IDLE_SOCKET_MS = 4_000;

/**
 * A `Send` over Node's `http` and `https` modules, through `agent` when one
 * is given (an `https.Agent` for an `https:` URL: to trust another CA, say),
 * else through kept-alive agents of its own.
 */
export function nodeSend(agent?: http.Agent): Send {
  let httpAgent: http.Agent | undefined;
  let httpsAgent: https.Agent | undefined;
  return ({ method, url, headers, body, signal }) =>
    new Promise<Incoming>((resolve, reject) => {
      const target = new URL(url);
      const secure = target.protocol === "https:";
      const through =
        agent ??
        (secure
          ? (httpsAgent ??= new https.Agent({ keepAlive: true, timeout: IDLE_SOCKET_MS }))
          : (httpAgent ??= new http.Agent({ keepAlive: true, timeout: IDLE_SOCKET_MS })));
      const outgoing: Record<string, string | number> = { ...headers };
      if (body !== undefined) outgoing["content-length"] = Buffer.byteLength(body);
      const request = (secure ? https.request : http.request)(
        target,
        { method, headers: outgoing, agent: through, signal },
        (response) => {
          const chunks: Buffer[] = [];
          response.on("data", (chunk: Buffer) => chunks.push(chunk));
          response.on("error", reject);
          response.on("aborted", () => reject(new Error("the answer was cut off")));
          response.on("end", () => {
            const answered = new Headers();
            for (const [name, value] of Object.entries(response.headers)) {
              if (value === undefined) continue;
              if (Array.isArray(value)) for (const one of value) answered.append(name, one);
              else answered.set(name, value);
            }
            resolve({
              status: response.statusCode ?? 0,
              headers: answered,
              text: chunks.length === 1 ? chunks[0]!.toString("utf8") : Buffer.concat(chunks).toString("utf8"),
            });
          });
        },
      );
      request.on("error", reject);
      request.end(body);
    });
}
