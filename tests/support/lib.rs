//! Support for the integration tests: the process harness for the real stack and the fake LLM
//! server that speaks the real wire formats, headless Chromium for pages.

pub mod browser;
pub mod fake_llm;
pub mod fault_proxy;
pub mod private_redis;
pub mod stack;
pub mod submit;
pub mod webhook;
