// Helpers the behaviour suites share.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { TurnstoreError } from "turnstore-client";

export const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** A fresh identifier, so that tests sharing a server never share data. */
export const id = (prefix: string): string => `${prefix}-${randomUUID()}`;

/** Asserts that `promise` rejects with a TurnstoreError, and returns it. */
export async function turnstoreError(promise: Promise<unknown>): Promise<TurnstoreError> {
  const outcome = await promise.then(
    (value) => ({ value }),
    (error: unknown) => ({ error }),
  );
  if (!("error" in outcome)) assert.fail(`expected a TurnstoreError, got ${JSON.stringify(outcome.value)}`);
  assert.ok(outcome.error instanceof TurnstoreError, `expected a TurnstoreError, got ${String(outcome.error)}`);
  return outcome.error;
}
