/**
 * The gateway's old address: the composition root moved to src/app/gateway.ts (issue 26), which http/ does not
 * import. Kept so the tests and tools that import `createGateway` from here keep working; new code imports
 * src/app/gateway.ts. The one file of http/ allowed to import app/ (eslint.config.js).
 */
export { createGateway, type Gateway, type GatewayOptions, type ReloadResult, type RouteSharing, type WorkerRole } from '../app/gateway.js';
