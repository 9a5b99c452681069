//! A shared fleet attacked by one of its tenants (issue 42), each attack on the real stack:
//! a tenant's program against the worker's LLM gateway (`tenancy/gateway.rs`), another team's
//! repository on the coordinator's disk (`tenancy/repos.rs`), webhooks aimed inside the
//! fleet's network (`tenancy/webhooks.rs`), a web page driving the open API
//! (`tenancy/open_api.rs`), another team's run ids (`tenancy/run_ids.rs`), limits above the
//! operator's ceilings (`tenancy/ceilings.rs`), images the operator did not allow
//! (`tenancy/images.rs`), a zlib bomb upload (`tenancy/uploads.rs`), a sparse file past the disk quota
//! (`tenancy/sparse.rs`), and the low items
//! (`tenancy/low.rs`). Each test plays the attacker and checks the attack is refused with
//! a clear error and nothing of another team's is read, spent or stalled.

#[path = "tenancy/ceilings.rs"]
mod ceilings;
#[path = "tenancy/gateway.rs"]
mod gateway;
#[path = "tenancy/images.rs"]
mod images;
#[path = "tenancy/kit.rs"]
mod kit;
#[path = "tenancy/low.rs"]
mod low;
#[path = "tenancy/open_api.rs"]
mod open_api;
#[path = "tenancy/repos.rs"]
mod repos;
#[path = "tenancy/run_ids.rs"]
mod run_ids;
#[path = "tenancy/sparse.rs"]
mod sparse;
#[path = "tenancy/uploads.rs"]
mod uploads;
#[path = "tenancy/webhooks.rs"]
mod webhooks;
