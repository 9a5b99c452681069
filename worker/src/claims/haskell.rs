//! Haskell definitions, signatures, calls and stubs, from tree-sitter's syntax tree
//! (tree-sitter-haskell). Only top-level declarations count: a function's equations are merged
//! into one definition, its signature kept beside it; class and instance bodies are the type's
//! representation and not definitions of their own.

use super::policy::Forbidden;
use super::{FileIndex, LanguageIndex};
use std::collections::BTreeSet;
use tree_sitter::{Node, Parser};

pub struct Haskell;

impl LanguageIndex for Haskell {
    fn handles(&self, path: &str) -> bool {
        path.ends_with(".hs")
    }

    fn index(&self, source: &str) -> Result<FileIndex, String> {
        let tree = parse(source)?;
        let src = source.as_bytes();
        let mut index = FileIndex::default();
        for decl in top_level(tree.root_node()) {
            match decl.kind() {
                "function" | "bind" => {
                    if let Some(name) = binding_name(decl, src) {
                        let mut calls = BTreeSet::new();
                        body_names(decl, src, &mut calls);
                        index.definitions.entry(name).or_default().extend(calls);
                    }
                }
                "signature" => {
                    let ty = decl
                        .child_by_field_name("type")
                        .map(|t| squash(text(t, src)))
                        .unwrap_or_default();
                    for name in signature_names(decl, src) {
                        index.signatures.insert(name, ty.clone());
                    }
                }
                "data_type" | "newtype" | "type_synomym" | "class" | "type_family" => {
                    if let Some(name) = decl.child_by_field_name("name") {
                        index
                            .definitions
                            .entry(text(name, src).to_string())
                            .or_default();
                    }
                }
                _ => {}
            }
        }
        Ok(index)
    }

    /// Top-level functions with an equation whose body is not a stub: `error "..."`,
    /// `error $ ...`, `errorWithoutStackTrace ...` or `undefined` (parentheses allowed), with
    /// no guards.
    fn not_stubbed(&self, source: &str) -> Result<Vec<String>, String> {
        let tree = parse(source)?;
        let src = source.as_bytes();
        let mut real = BTreeSet::new();
        let mut seen = Vec::new();
        for decl in top_level(tree.root_node()) {
            if !matches!(decl.kind(), "function" | "bind") {
                continue;
            }
            let Some(name) = binding_name(decl, src) else {
                continue;
            };
            if !seen.contains(&name) {
                seen.push(name.clone());
            }
            let mut cursor = decl.walk();
            let matches: Vec<Node<'_>> =
                decl.children_by_field_name("match", &mut cursor).collect();
            let stub = !matches.is_empty()
                && matches.iter().all(|m| {
                    m.child_by_field_name("guards").is_none()
                        && m.child_by_field_name("expression")
                            .is_some_and(|e| is_stub(e, src))
                });
            if !stub {
                real.insert(name);
            }
        }
        Ok(seen.into_iter().filter(|n| real.contains(n)).collect())
    }
}

/// What Haskell implementation code may not reference, by default: modules (a module and those
/// below it), `LANGUAGE` extensions (`ext:`), pragmas (`pragma:`) and declarations (`decl:`).
/// Pure code cannot print or exit; these are the ways around that (unsafe I/O, the FFI, Template
/// Haskell, the preprocessor, ghc flags from the source) and the test framework itself.
pub const HASKELL_FORBIDDEN: &[&str] = &[
    "System.IO",
    "System.Exit",
    "System.Process",
    "System.Posix",
    "System.Environment",
    "System.Directory",
    "System.Mem",
    "System.Timeout",
    "Unsafe",
    "Foreign",
    "GHC",
    "Debug.Trace",
    "Control.Concurrent",
    "Control.Monad.ST.Unsafe",
    "Data.IORef",
    "Language.Haskell.TH",
    "Test.QuickCheck",
    "ext:CPP",
    "ext:TemplateHaskell",
    "ext:TemplateHaskellQuotes",
    "ext:QuasiQuotes",
    "ext:ForeignFunctionInterface",
    "ext:CApiFFI",
    "ext:UnliftedFFITypes",
    "ext:GHCForeignImportPrim",
    "ext:MagicHash",
    "ext:UnboxedTuples",
    "ext:PackageImports",
    "ext:Unsafe",
    "ext:Trustworthy",
    "pragma:OPTIONS_GHC",
    "pragma:OPTIONS",
    "pragma:INCLUDE",
    "decl:foreign",
    "decl:splice",
];

/// What a Haskell test module may not use: whatever changes how ghc compiles it or the
/// modules around it (flags and preprocessors from the source, CPP, Template Haskell, the FFI,
/// leaving Safe Haskell). Tests may do I/O (`ioProperty`); what they print is checked against
/// the runner's own count.
pub const HASKELL_TEST_FORBIDDEN: &[&str] = &[
    "Language.Haskell.TH",
    "ext:CPP",
    "ext:TemplateHaskell",
    "ext:TemplateHaskellQuotes",
    "ext:QuasiQuotes",
    "ext:ForeignFunctionInterface",
    "ext:CApiFFI",
    "ext:GHCForeignImportPrim",
    "ext:Unsafe",
    "ext:Trustworthy",
    "pragma:OPTIONS_GHC",
    "pragma:OPTIONS",
    "pragma:OPTIONS_HADDOCK",
    "pragma:INCLUDE",
    "decl:foreign",
    "decl:splice",
];

/// The `{-# ... #-}` pragmas of a source read as text (no parse: a file ghc may compile is
/// checked whatever it holds), as `forbidden` names them (`pragma:OPTIONS_GHC`, `ext:CPP`)
/// with their lines.
pub fn pragmas(source: &str) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    let mut rest = source;
    let mut offset = 0;
    while let Some(open) = rest.find("{-#") {
        let body_start = open + 3;
        let Some(len) = rest[body_start..].find("#-}") else {
            break;
        };
        let body = rest[body_start..body_start + len].trim();
        let line = source[..offset + open].matches('\n').count() + 1;
        let (word, args) = body.split_once(char::is_whitespace).unwrap_or((body, ""));
        let word = word.to_ascii_uppercase();
        if word == "LANGUAGE" {
            for ext in args.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                found.push((format!("ext:{ext}"), line));
            }
        } else {
            found.push((format!("pragma:{word}"), line));
        }
        let next = body_start + len + 3;
        offset += next;
        rest = &rest[next..];
    }
    found
}

/// Forbidden references in a Haskell source: imported modules, `LANGUAGE` extensions and
/// pragmas, `foreign` declarations and Template Haskell splices. An unparsable source is an
/// error.
pub fn forbidden(source: &str, rules: &[String]) -> Result<Vec<Forbidden>, String> {
    let tree = parse(source)?;
    let src = source.as_bytes();
    let mut found: Vec<(String, usize)> = Vec::new();
    let mut stack = vec![tree.root_node()];
    while let Some(n) = stack.pop() {
        let line = n.start_position().row + 1;
        match n.kind() {
            "import" => {
                if let Some(m) = n.child_by_field_name("module") {
                    found.push((text(m, src).to_string(), line));
                }
            }
            "pragma" => {
                let body = text(n, src)
                    .trim_start_matches("{-#")
                    .trim_end_matches("#-}")
                    .trim();
                let (word, rest) = body.split_once(char::is_whitespace).unwrap_or((body, ""));
                let word = word.to_ascii_uppercase();
                if word == "LANGUAGE" {
                    for ext in rest.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                        found.push((format!("ext:{ext}"), line));
                    }
                } else {
                    found.push((format!("pragma:{word}"), line));
                }
            }
            "foreign_import" | "foreign_export" => found.push(("decl:foreign".into(), line)),
            "top_splice" | "splice" | "quasiquote" => found.push(("decl:splice".into(), line)),
            _ => {}
        }
        let mut cursor = n.walk();
        stack.extend(n.children(&mut cursor));
    }
    let mut out: Vec<Forbidden> = found
        .into_iter()
        .filter_map(|(name, line)| {
            let rule = rules.iter().find(|r| {
                name == **r || (!r.contains(':') && name.starts_with(&format!("{r}.")))
            })?;
            Some(Forbidden {
                name,
                rule: rule.clone(),
                line,
            })
        })
        .collect();
    out.sort_by(|a, b| (a.line, &a.name).cmp(&(b.line, &b.name)));
    out.dedup();
    Ok(out)
}

pub(crate) fn parse(source: &str) -> Result<tree_sitter::Tree, String> {
    let mut parser = Parser::new();
    parser
        .set_language(&tree_sitter_haskell::LANGUAGE.into())
        .map_err(|e| e.to_string())?;
    let tree = parser
        .parse(source, None)
        .ok_or_else(|| "the parser gave no tree".to_string())?;
    if tree.root_node().has_error() {
        return Err("the haskell source does not parse".into());
    }
    Ok(tree)
}

/// The module's name from its header; a file without one is `Main`.
pub fn module_name(source: &str) -> Result<String, String> {
    let tree = parse(source)?;
    let root = tree.root_node();
    let mut cursor = root.walk();
    let header = root.children(&mut cursor).find(|n| n.kind() == "header");
    Ok(match header.and_then(|h| h.child_by_field_name("module")) {
        Some(m) => text(m, source.as_bytes()).to_string(),
        None => "Main".into(),
    })
}

/// The top-level `prop_*` bindings, in source order, once each.
pub fn properties(source: &str) -> Result<Vec<String>, String> {
    let tree = parse(source)?;
    let src = source.as_bytes();
    let mut out: Vec<String> = Vec::new();
    for decl in top_level(tree.root_node()) {
        if matches!(decl.kind(), "function" | "bind") {
            if let Some(name) = binding_name(decl, src) {
                if name.starts_with("prop_") && !out.contains(&name) {
                    out.push(name);
                }
            }
        }
    }
    Ok(out)
}

/// The declarations directly under the module.
fn top_level(root: Node<'_>) -> Vec<Node<'_>> {
    let mut out = Vec::new();
    let mut cursor = root.walk();
    for child in root.children(&mut cursor) {
        if child.kind() == "declarations" {
            let mut inner = child.walk();
            out.extend(child.named_children(&mut inner));
        }
    }
    out
}

fn binding_name(decl: Node<'_>, src: &[u8]) -> Option<String> {
    let name = decl.child_by_field_name("name")?;
    Some(text(name, src).trim_matches(['(', ')', ' ']).to_string())
}

/// `push :: ...` names one binding, `push, pop :: ...` several (a `binding_list`, whose first
/// name the grammar also files under the signature's own `name` field).
fn signature_names(decl: Node<'_>, src: &[u8]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut add = |n: Node<'_>| {
        let name = text(n, src).trim_matches(['(', ')', ' ']).to_string();
        if !out.contains(&name) {
            out.push(name);
        }
    };
    let mut cursor = decl.walk();
    for n in decl.children_by_field_name("name", &mut cursor) {
        add(n);
    }
    if let Some(list) = decl.child_by_field_name("names") {
        let mut inner = list.walk();
        for n in list.named_children(&mut inner) {
            add(n);
        }
    }
    out
}

/// Names a definition's equations use (its bodies, guards and `where` bindings; not its
/// parameters): `push x s` gives `push`, `S.push x` gives `push`.
fn body_names(decl: Node<'_>, src: &[u8], out: &mut BTreeSet<String>) {
    let mut used = BTreeSet::new();
    let mut cursor = decl.walk();
    for field in ["match", "binds"] {
        for part in decl.children_by_field_name(field, &mut cursor) {
            collect_names(part, src, &mut used);
        }
        cursor.reset(decl);
    }
    let mut params = BTreeSet::new();
    if let Some(patterns) = decl.child_by_field_name("patterns") {
        collect_names(patterns, src, &mut params);
    }
    out.extend(used.difference(&params).cloned());
}

fn collect_names(node: Node<'_>, src: &[u8], out: &mut BTreeSet<String>) {
    let mut stack = vec![node];
    while let Some(n) = stack.pop() {
        match n.kind() {
            "variable" | "operator" => {
                out.insert(text(n, src).to_string());
            }
            _ => {
                let mut cursor = n.walk();
                stack.extend(n.named_children(&mut cursor));
            }
        }
    }
}

/// `error "..."`, `error $ ...`, `errorWithoutStackTrace "..."`, `undefined`, in parentheses
/// or not.
fn is_stub(expr: Node<'_>, src: &[u8]) -> bool {
    let is_error = |n: Node<'_>| {
        n.kind() == "variable" && matches!(text(n, src), "error" | "errorWithoutStackTrace")
    };
    match expr.kind() {
        "parens" => expr.named_child(0).is_some_and(|inner| is_stub(inner, src)),
        "variable" => text(expr, src) == "undefined",
        "apply" => expr.child_by_field_name("function").is_some_and(is_error),
        "infix" => {
            let op = expr.child_by_field_name("operator");
            expr.child_by_field_name("left_operand")
                .is_some_and(is_error)
                && op.is_some_and(|o| text(o, src) == "$")
        }
        _ => false,
    }
}

fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn text<'a>(node: Node<'_>, src: &'a [u8]) -> &'a str {
    node.utf8_text(src).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const STACK: &str = r#"module Data.Stack
  ( Stack
  , empty
  , push
  , pop
  , size
  ) where

import qualified Data.List as L

-- | A LIFO stack.
data Stack a = Empty | Push a (Stack a)
  deriving (Show, Eq)

empty :: Stack a
empty = error "TODO: implement empty"

push :: a -> Stack a -> Stack a
push = error "TODO: implement push"

pop :: Stack a -> Maybe (a, Stack a)
pop Empty = Nothing
pop (Push x s) = Just (x, s)

size :: Stack a -> Int
size s = error $ "TODO: implement " ++ "size"

peek, top :: Stack a -> Maybe a
peek = undefined
top s = (error "TODO")

toList :: Stack a -> [a]
toList s
  | otherwise = error "TODO"
"#;

    #[test]
    fn definitions_and_signatures_are_the_top_level_ones() {
        let ix = Haskell.index(STACK).unwrap();
        let names: Vec<&str> = ix.definitions.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            ["Stack", "empty", "peek", "pop", "push", "size", "toList", "top"]
        );
        assert_eq!(ix.signatures["push"], "a -> Stack a -> Stack a");
        assert_eq!(ix.signatures["peek"], "Stack a -> Maybe a");
        assert_eq!(ix.signatures["top"], "Stack a -> Maybe a");
        assert!(ix.definitions["size"].contains("error"));
        // Parameters are not calls; constructors are not variables.
        assert!(
            ix.definitions["pop"].is_empty(),
            "{:?}",
            ix.definitions["pop"]
        );
    }

    #[test]
    fn stubs_are_error_undefined_or_error_dollar() {
        let real = Haskell.not_stubbed(STACK).unwrap();
        // `pop` has real equations; `toList`'s body sits behind a guard.
        assert_eq!(real, ["pop", "toList"]);
    }

    #[test]
    fn calls_per_definition_see_qualified_names_and_where_bindings() {
        let src = r#"module Spec where
import Test.QuickCheck
import qualified Data.Stack as S

prop_lifo :: [Int] -> Bool
prop_lifo xs = drain (foldr S.push S.empty xs) == xs
  where
    drain s = case S.pop s of
      Nothing -> []
      Just (x, rest) -> x : drain rest

prop_size :: Int -> Bool
prop_size = error "SPEC[size]: push adds one"
"#;
        let ix = Haskell.index(src).unwrap();
        let lifo = &ix.definitions["prop_lifo"];
        for name in ["push", "empty", "pop", "foldr", "drain"] {
            assert!(lifo.contains(name), "{name} not in {lifo:?}");
        }
        assert_eq!(properties(src).unwrap(), ["prop_lifo", "prop_size"]);
        assert_eq!(module_name(src).unwrap(), "Spec");
        assert_eq!(module_name("main = pure ()\n").unwrap(), "Main");
        assert!(Haskell.handles("test/Spec.hs") && !Haskell.handles("stack.py"));
    }

    #[test]
    fn the_policy_refuses_unsafe_io_the_ffi_the_preprocessor_and_ghc_flags() {
        let rules: Vec<String> = HASKELL_FORBIDDEN.iter().map(|r| r.to_string()).collect();
        let src = r#"{-# LANGUAGE CPP, ScopedTypeVariables #-}
{-# OPTIONS_GHC -F -pgmF ./evil #-}
module Data.Stack (push) where

import System.IO.Unsafe (unsafePerformIO)
import qualified Data.Map as M
import Foreign.C.Types

foreign import ccall "exit" c_exit :: Int -> ()

push :: a -> [a] -> [a]
push x xs = x : xs
"#;
        let hits: Vec<(String, usize)> = forbidden(src, &rules)
            .unwrap()
            .into_iter()
            .map(|h| (h.name, h.line))
            .collect();
        let want = [
            ("ext:CPP", 1),
            ("pragma:OPTIONS_GHC", 2),
            ("System.IO.Unsafe", 5),
            ("Foreign.C.Types", 7),
            ("decl:foreign", 9),
        ];
        assert_eq!(
            hits,
            want.map(|(n, l)| (n.to_string(), l)).to_vec(),
            "{hits:?}"
        );
        let plain = "module Data.Stack where\nimport Data.List (foldl')\npush = (:)\n";
        assert!(forbidden(plain, &rules).unwrap().is_empty());
    }

    #[test]
    fn test_modules_may_do_io_but_not_change_how_ghc_compiles_them() {
        let rules: Vec<String> = HASKELL_TEST_FORBIDDEN
            .iter()
            .map(|r| r.to_string())
            .collect();
        let honest = "module Spec where\nimport Data.Stack\nimport Test.QuickCheck\nimport Data.IORef\n\nprop_io :: Property\nprop_io = ioProperty (pure True)\n";
        assert!(forbidden(honest, &rules).unwrap().is_empty());
        for (src, name) in [
            (
                "{-# OPTIONS_GHC -F -pgmF test/pp.sh #-}\nmodule Spec where\n",
                "pragma:OPTIONS_GHC",
            ),
            (
                "{-# options_ghc -fplugin=X #-}\nmodule Spec where\n",
                "pragma:OPTIONS_GHC",
            ),
            (
                "{-# LANGUAGE TemplateHaskell #-}\nmodule Spec where\n",
                "ext:TemplateHaskell",
            ),
            (
                "{-# LANGUAGE Trustworthy #-}\nmodule Spec where\n",
                "ext:Trustworthy",
            ),
            ("{-# LANGUAGE CPP #-}\nmodule Spec where\n", "ext:CPP"),
            (
                "module Spec where\nimport Language.Haskell.TH\n",
                "Language.Haskell.TH",
            ),
        ] {
            let hits = forbidden(src, &rules).unwrap();
            assert_eq!(hits.first().map(|h| h.name.as_str()), Some(name), "{src}");
        }
    }

    #[test]
    fn pragmas_are_read_as_text_whatever_the_source_holds() {
        let src = "{-#options_ghc -F -pgmF x#-}\n{-# LANGUAGE CPP,\n  TemplateHaskell #-}\nmodule = = (\n{-# INLINE f #-}\n{-# unclosed";
        assert_eq!(
            pragmas(src),
            [
                ("pragma:OPTIONS_GHC".to_string(), 1),
                ("ext:CPP".to_string(), 2),
                ("ext:TemplateHaskell".to_string(), 2),
                ("pragma:INLINE".to_string(), 5),
            ]
        );
        assert!(pragmas("module M where\nx = 1\n").is_empty());
    }

    #[test]
    fn a_source_that_does_not_parse_is_an_error() {
        assert!(Haskell.index("module where = = (").is_err());
        assert!(properties("prop_x = (").is_err());
    }
}
