-- | A LIFO stack (seed 003).
module Data.Stack
  ( Stack
  , empty
  , push
  , pop
  , peek
  , size
  , isEmpty
  ) where

-- | A stack of values, the most recently pushed on top.
data Stack a = Empty | Push a (Stack a)
  deriving (Show, Eq)

-- | The empty stack.
empty :: Stack a
empty = Empty

-- | Add to the top.
push :: a -> Stack a -> Stack a
push = Push

-- | The top and the rest, if any.
pop :: Stack a -> Maybe (a, Stack a)
pop Empty = Nothing
pop (Push x s) = Just (x, s)

-- | The top, if any.
peek :: Stack a -> Maybe a
peek = fmap fst . pop

-- | How many values.
size :: Stack a -> Int
size Empty = 0
size (Push _ s) = 1 + size s

-- | Whether there is none.
isEmpty :: Stack a -> Bool
isEmpty s = size s == 0
