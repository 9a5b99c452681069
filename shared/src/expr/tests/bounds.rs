//! The bounds on renders: fuel, output and bound values, refused constructs, and templates
//! the guard rewrites rendering as before.

use super::*;

/// Renders with a deadline: every attack below must end, with an error, well within it.
fn render_quickly(template: &str, ctx: &Value) -> Result<String, ExprError> {
    let (rendered, took) = timed(|| render("t", template, ctx));
    assert!(
        took < std::time::Duration::from_secs(5),
        "{template}: {took:?}"
    );
    rendered
}

fn refused(template: &str, needle: &str) {
    match render_quickly(template, &json!({})) {
        Err(e) => assert!(e.to_string().contains(needle), "{template}: {e}"),
        Ok(out) => panic!("{template} rendered {} bytes", out.len()),
    }
}

#[test]
fn the_doubling_loop_of_the_issue_is_bounded() {
    // minijinja scopes a `set` inside a loop body to the iteration (as Jinja does): every
    // iteration doubles the outer `'x'` once and forgets it.
    let doubling = "{% set s = 'x' %}{% for i in range(60) %}{% set s = s ~ s %}{% endfor %}";
    assert_eq!(render_quickly(doubling, &json!({})).unwrap(), "");
    assert_eq!(
        render_quickly(&format!("{doubling}{{{{ s|length }}}}"), &json!({})).unwrap(),
        "1"
    );
    // What carries a value across iterations is a namespace: refused, at check time too.
    let ns = "{% set ns = namespace(s='x') %}{% for i in range(60) %}\
                  {% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}";
    refused(ns, "namespace() is not available");
    assert!(template_variables("t", ns)
        .unwrap_err()
        .to_string()
        .contains("namespace"));
    assert!(compile_check("namespace(a=1)").is_err());
}

#[test]
fn doubling_a_string_sixty_times_is_refused_quickly() {
    let bound = "MAX_TEMPLATE_VALUE_BYTES";
    // Straight-line sets.
    refused(
        &format!(
            "{{% set s = 'x' %}}{}{{{{ s }}}}",
            "{% set s = s ~ s %}".repeat(60)
        ),
        bound,
    );
    // Nested `with` blocks.
    refused(
        &format!(
            "{{% with s = 'x' %}}{}{{{{ s }}}}{}{{% endwith %}}",
            "{% with s = s ~ s %}".repeat(60),
            "{% endwith %}".repeat(60)
        ),
        bound,
    );
    // Nested loops over one doubled item each.
    refused(
        &format!(
            "{{% for s in ['x'] %}}{}{{{{ s }}}}{}{{% endfor %}}",
            "{% for s in [s ~ s] %}".repeat(60),
            "{% endfor %}".repeat(60)
        ),
        bound,
    );
    // Captured blocks: counted as they are emitted.
    refused(
        &format!(
            "{{% set s %}}x{{% endset %}}{}{{{{ s }}}}",
            "{% set s %}{{ s }}{{ s }}{% endset %}".repeat(60)
        ),
        "MAX_RENDERED_BYTES",
    );
    // Nested lists walked by a consumer.
    refused(
        &format!(
            "{{% set s = ['x'] %}}{}{{{{ s|join }}}}",
            "{% set s = [s, s] %}".repeat(60)
        ),
        bound,
    );
    // minijinja's own repetition (up to 100 MB), then one doubling.
    refused(
        "{% set s = 'x' * 50000000 %}{% set s = s ~ s %}{{ s|length }}",
        bound,
    );
    // A sequence repeated a trillion times, joined or looped over.
    refused("{{ (['x'] * 1000000000000)|join }}", bound);
    refused(
        "{% for x in ['x'] * 1000000000000 %}{% endfor %}",
        "MAX_LOOP_ITEMS",
    );
    for filter in [
        "list", "sort", "unique", "reverse", "sum", "max", "string", "pprint",
    ] {
        refused(&format!("{{{{ ([1] * 1000000000000)|{filter} }}}}"), bound);
    }
    // Recursion doubles per call: macros and recursive loops are refused before running.
    let mac = "{% macro d(s, n) %}{% if n %}{{ d(s ~ s, n - 1) }}{% else %}{{ s|length }}\
                   {% endif %}{% endmacro %}{{ d('x', 60) }}";
    refused(mac, "macros are not available");
    assert!(template_variables("t", mac).is_err());
    let rec = "{% for s in ['x'] recursive %}{{ loop([s ~ s]) }}{% endfor %}";
    refused(rec, "recursive loops");
    assert!(template_variables("t", rec).is_err());
    // An expression cannot bind, but its value is measured.
    let (v, took) = timed(|| eval("('x' * 40000000) ~ ('x' * 40000000)", &json!({})));
    assert!(took < std::time::Duration::from_secs(5));
    assert!(v.unwrap_err().to_string().contains(bound));
}

#[test]
fn nested_ranges_run_out_of_fuel() {
    refused(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "ran out of fuel",
    );
    let (v, took) = timed(|| {
        eval(
            "range(100000) | list | difference(range(100000) | list)",
            &json!({}),
        )
    });
    assert!(took < std::time::Duration::from_secs(5));
    assert!(v.unwrap_err().to_string().contains("MAX_LOOP_ITEMS"));
}

#[test]
fn the_rendered_output_is_bounded() {
    let text = "x".repeat(100);
    refused(
        &format!("{{% for i in range(100000) %}}{text}{{% endfor %}}"),
        "MAX_RENDERED_BYTES",
    );
    let big = json!({"s": "y".repeat(600 * 1024)});
    assert!(render_quickly("{{ s }}{{ s }}", &big)
        .unwrap_err()
        .to_string()
        .contains("MAX_RENDERED_BYTES"));
    assert_eq!(render_quickly("{{ s }}", &big).unwrap().len(), 600 * 1024);
}

#[test]
fn guarded_templates_render_as_before() {
    let ctx = json!({"xs": [1, 2, 3], "d": {"a": 1, "b": 2}, "s": "a %} b"});
    for (template, expected) in [
        ("{% set a, b = 1, 2 %}{{ a }}{{ b }}", "12"),
        ("{% set a = xs | length if xs else 0 -%}\n{{ a }}", "3"),
        ("{%- set a = '%}' -%} {{ a }}", "%}"),
        (
            "{% with a = 1, b = [2, 3] %}{{ a }}{{ b | length }}{% endwith %}",
            "12",
        ),
        (
            "{% for x in xs if x > 1 %}{{ loop.index }}/{{ loop.length }}:{{ x }} {% endfor %}",
            "1/2:2 2/2:3 ",
        ),
        ("{% for x in [] %}a{% else %}empty{% endfor %}", "empty"),
        (
            "{% for k, v in d | items %}{{ k }}={{ v }};{% endfor %}",
            "a=1;b=2;",
        ),
        ("{% for k in d %}{{ k }}{% endfor %}", "ab"),
        ("{% for c in 'ab' %}{{ c }}.{% endfor %}", "a.b."),
        ("{% for x in missing.thing %}a{% endfor %}", ""),
        ("{% set x %}cap{{ xs[0] }}{% endset %}{{ x }}", "cap1"),
        ("{% raw %}{% macro m() %}{% endraw %}", "{% macro m() %}"),
        (
            "{{ '{% macro m() %}' }}{# {% macro %} #}",
            "{% macro m() %}",
        ),
        ("{{ s }}{% if s == 'x' %}y{% endif %}", "a %} b"),
        (
            "{{ xs | join(', ') }} {{ none }} {{ [none] | join }}",
            "1, 2, 3 None None",
        ),
        (
            "{{ xs | reverse | list }} {{ xs | sort(reverse=true) | first }} {{ xs | sum }}",
            "[3, 2, 1] 3 6",
        ),
        (
            "{{ [2, 1, 2] | unique | list }} {{ d | dictsort | first | join('=') }} \
                 {{ xs | batch(2) | list | length }} {{ xs | max }}{{ xs | min }} {{ 1 | string }}",
            "[2, 1] a=1 2 31 1",
        ),
    ] {
        assert_eq!(render("t", template, &ctx).unwrap(), expected, "{template}");
    }
}

#[test]
fn templates_report_their_variables() {
    let vars =
        template_variables("t", "{{ input.x }} {% for f in files %}{{ f }}{% endfor %}").unwrap();
    assert!(vars.contains("input") && vars.contains("files"));
    assert!(!vars.contains("f"));
}
