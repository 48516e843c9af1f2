/**
 * Whose a stored response is (docs/security.md "tenant model for stored responses"). vLLM's store has no owners: any
 * client that names an id may read it, cancel it, continue it (`previous_response_id`) or overwrite it (the same id
 * as `request_id`). Waybill binds each id to the tenant that created it, in one of two ways:
 *
 * - **An id Waybill chose.** A `POST /v1/responses` without `request_id` is sent upstream with one Waybill mints:
 *   `resp_w1-<nonce>-<tag>`, the tag an HMAC-SHA256 of the tenant and the nonce under `responses.id_secret_env`'s
 *   secret (or a built-in key). Any replica, before or after a restart, checks a request's tenant against the id
 *   itself: no state, nothing shared.
 * - **An id the client (or an upstream ignoring `request_id`) chose.** The tenant whose request carried it is
 *   remembered in this process (at most `responses.max_remembered_ids`, least recent forgotten) and, with
 *   `server.workers`, told to the other workers through their primary (`onBind`, `learn`): on another replica, or
 *   after a restart, nobody owns it and nobody can use it through Waybill.
 *
 * An id with no owner is usable only while no client keys are configured (everyone is `_anonymous`: there is no
 * other tenant to protect, and ids created behind the gateway's back stay readable).
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';

/** What a minted id looks like: version 1, a 128-bit nonce, a 128-bit tag (hex). */
const MINTED = /^resp_w1-([0-9a-f]{32})-([0-9a-f]{32})$/;

/**
 * The HMAC key without a configured secret. Public: a tag still binds (a tenant is checked against the id, and no
 * tenant can make an id that passes as another's — refused at creation), but anyone holding an id can test which
 * tenant name made it.
 */
const BUILT_IN_KEY = 'waybill response id binding v1';

export interface OwnerSettings {
  /** `responses.id_secret_env`'s value; undefined: the built-in key. */
  readonly secret: string | undefined;
  /** Owners of ids Waybill did not choose, remembered at most (0: none). */
  readonly capacity: number;
  /**
   * No client keys are configured: an id nobody owns is usable by everyone (all are `_anonymous`). A function: keys
   * come and go with a reload, and the answer is the configuration's in force.
   */
  readonly unownedUsable: boolean | (() => boolean);
  /** Each owner this process learned from an answer it relayed: the other workers are told (app/worker-link.ts). */
  readonly onBind?: ((id: string, tenant: string) => void) | undefined;
}

export class ResponseOwners {
  private readonly key: string;
  /** Id → tenant, for ids Waybill did not choose; least recently used first. */
  private readonly owners = new Map<string, string>();

  constructor(private readonly settings: OwnerSettings) {
    this.key = settings.secret ?? BUILT_IN_KEY;
  }

  /** A fresh id for `tenant`'s response, bound to it. */
  mint(tenant: string): string {
    const nonce = randomBytes(16).toString('hex');
    return `resp_w1-${nonce}-${this.tag(tenant, nonce).toString('hex')}`;
  }

  /**
   * Whether `tenant` may read, cancel or continue the response `id`. False is answered exactly as an id nobody
   * holds (the same 404, with no upstream asked), so it tells nothing about whether the id exists.
   */
  mayUse(tenant: string, id: string): boolean {
    const minted = MINTED.exec(id);
    if (minted !== null) return this.verifies(tenant, minted[1] ?? '', minted[2] ?? '');
    const owner = this.owners.get(id);
    if (owner === undefined) return typeof this.settings.unownedUsable === 'function' ? this.settings.unownedUsable() : this.settings.unownedUsable;
    this.touch(id, owner);
    return owner === tenant;
  }

  /**
   * Whether `tenant` may create a response under the id it chose (`request_id`): not an id of Waybill's shape
   * unless it is bound to this tenant, and not an id another tenant's request created (that would overwrite it).
   */
  mayCreate(tenant: string, id: string): boolean {
    const minted = MINTED.exec(id);
    if (minted !== null) return this.verifies(tenant, minted[1] ?? '', minted[2] ?? '');
    const owner = this.owners.get(id);
    return owner === undefined || owner === tenant;
  }

  /** `tenant`'s request created the response `id` (an answer carried it): remember the owner unless the id says it. */
  bind(id: string, tenant: string): void {
    if (this.learn(id, tenant)) this.settings.onBind?.(id, tenant);
  }

  /** Another worker's process relayed the answer that created `id` for `tenant`; false: nothing to remember. */
  learn(id: string, tenant: string): boolean {
    if (this.settings.capacity === 0 || MINTED.test(id)) return false;
    this.touch(id, tenant);
    if (this.owners.size > this.settings.capacity) {
      const oldest = this.owners.keys().next();
      if (oldest.done !== true) this.owners.delete(oldest.value);
    }
    return true;
  }

  private touch(id: string, tenant: string): void {
    this.owners.delete(id);
    this.owners.set(id, tenant);
  }

  private verifies(tenant: string, nonce: string, tag: string): boolean {
    // Constant time: the comparison does not tell how much of a forged tag was right.
    return timingSafeEqual(this.tag(tenant, nonce), Buffer.from(tag, 'hex'));
  }

  private tag(tenant: string, nonce: string): Buffer {
    // NUL-separated: tenant names never hold one, so no (tenant, nonce) pair reads as another.
    return createHmac('sha256', this.key).update(`${tenant}\0${nonce}`).digest().subarray(0, 16);
  }
}
