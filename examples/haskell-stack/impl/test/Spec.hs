-- | The properties of Data.Stack (seed 003).
module Spec where

import Data.Stack
import Test.QuickCheck

fromList :: [a] -> Stack a
fromList = foldr push empty

drain :: Stack a -> [a]
drain s = case pop s of
  Nothing -> []
  Just (x, rest) -> x : drain rest

prop_empty :: Bool
prop_empty = isEmpty (empty :: Stack Int) && size (empty :: Stack Int) == 0

prop_push_peek :: Int -> [Int] -> Bool
prop_push_peek x xs = peek (push x (fromList xs)) == Just x

prop_push_pop_inverse :: Int -> [Int] -> Bool
prop_push_pop_inverse x xs = pop (push x s) == Just (x, s)
  where
    s = fromList xs

prop_lifo_order :: [Int] -> Bool
prop_lifo_order xs = drain (foldl (flip push) empty xs) == reverse xs

prop_size_counts :: [Int] -> Property
prop_size_counts xs = size (fromList xs) === length xs
