-- | The properties of Data.Stack (seed 003): each a specification that fails until written.
module Spec where

import Data.Stack
import Test.QuickCheck

prop_empty :: Bool
prop_empty = error "SPEC[empty]: isEmpty empty and size empty == 0"

prop_push_peek :: Int -> [Int] -> Bool
prop_push_peek = error "SPEC[push]: peek (push x s) == Just x"

prop_push_pop_inverse :: Int -> [Int] -> Bool
prop_push_pop_inverse = error "SPEC[pop]: pop (push x s) == Just (x, s)"

prop_lifo_order :: [Int] -> Bool
prop_lifo_order = error "SPEC[lifo]: pushing xs then popping all gives reverse xs"

prop_size_counts :: [Int] -> Property
prop_size_counts = error $ "SPEC[size]: " ++ "size counts the pushes"
