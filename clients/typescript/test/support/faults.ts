// A fetch that forwards to the real server but can simulate what goes wrong
// between a client and turnstore: replies lost after the server acted,
// replies that never come, connections refused, a proxy answering instead.

export type Fault =
  /** The server handles the request; its reply is lost (connection reset). */
  | { kind: "lose-reply" }
  /** The request never reaches the server. */
  | { kind: "refuse" }
  /** The server handles the request; the reply hangs until the client gives up. */
  | { kind: "stall" }
  /** A proxy (or a stand-in for the server) answers instead of the server, which never sees the request. */
  | { kind: "respond"; status: number; body: string; contentType: string; headers?: Record<string, string> }
  /** The server handles the request; its reply is replaced. */
  | { kind: "rewrite"; rewrite: (response: Response) => Promise<Response> };

export interface SeenRequest {
  method: string;
  path: string;
  headers: Headers;
  body: string;
}

export class FaultyFetch {
  readonly seen: SeenRequest[] = [];

  /** `plan` gets each request and how many came before it; undefined: forward untouched. */
  constructor(private readonly plan: (request: SeenRequest, index: number) => Fault | undefined) {}

  readonly fetch = async (request: Request): Promise<Response> => {
    const seen: SeenRequest = {
      method: request.method,
      path: new URL(request.url).pathname,
      headers: new Headers(request.headers),
      body: request.body ? await request.clone().text() : "",
    };
    const fault = this.plan(seen, this.seen.length);
    this.seen.push(seen);
    switch (fault?.kind) {
      case undefined:
        return fetch(request);
      case "refuse":
        throw new TypeError("fetch failed", { cause: new Error("connect ECONNREFUSED (simulated)") });
      case "lose-reply": {
        const response = await fetch(request);
        await response.arrayBuffer();
        throw new TypeError("fetch failed", { cause: new Error("socket hang up (simulated)") });
      }
      case "stall": {
        const response = await fetch(request);
        await response.arrayBuffer();
        return new Promise<Response>((_, reject) => {
          const fail = (): void => reject(request.signal.reason);
          if (request.signal.aborted) fail();
          request.signal.addEventListener("abort", fail, { once: true });
        });
      }
      case "respond":
        return new Response(fault.body, {
          status: fault.status,
          headers: { ...fault.headers, "content-type": fault.contentType },
        });
      case "rewrite":
        return fault.rewrite(await fetch(request));
    }
  };

  count(method: string, pathPrefix: string): number {
    return this.seen.filter((r) => r.method === method && r.path.startsWith(pathPrefix)).length;
  }
}

/** A problem document as turnstore would send it (with these headers besides). */
export function problem(status: number, code: string, headers: Record<string, string> = {}): Fault {
  return {
    kind: "respond",
    status,
    headers,
    contentType: "application/problem+json",
    body: JSON.stringify({
      type: `urn:turnstore:problem:${code}`,
      title: code,
      status,
      detail: `simulated ${code}`,
      code,
    }),
  };
}
