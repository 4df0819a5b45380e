//! Runs a model under a memory budget through the engine's builder, as `sparrow run --memory-budget`
//! does: `cargo run -p engine --example budget -- MODEL BUDGET "PROMPT"` (MODEL a path or a known
//! model's name, BUDGET such as `300M`; a resident file from `sparrow convert` is offloaded within it).

use engine::{EngineBuilder, Flow, GenerateRequest, MemoryBudget};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, budget, prompt] = args.as_slice() else {
        return Err("usage: budget MODEL BUDGET PROMPT".into());
    };
    let loaded = EngineBuilder::new(model)
        .budget(MemoryBudget::Process(engine::parse_size(budget)?))
        .log(|_, line| eprintln!("budget: {line}"))
        .open()?;
    let eng = loaded.engine()?;
    let ids = eng.tokenizer().encode(prompt, false)?;
    let req = GenerateRequest {
        max_tokens: 32,
        ..Default::default()
    };
    let out = eng.generate(&ids, &req, |piece| {
        print!("{piece}");
        Flow::Continue
    })?;
    println!("\n{:.1} tok/s decode", out.timings.decode_tok_s());
    Ok(())
}
