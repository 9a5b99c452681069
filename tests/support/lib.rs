pub mod fake_llm;
