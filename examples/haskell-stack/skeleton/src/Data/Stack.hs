-- | A LIFO stack (seed 003): the skeleton, every function a stub.
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
empty = error "TODO: implement empty"

-- | Add to the top.
push :: a -> Stack a -> Stack a
push = error "TODO: implement push"

-- | The top and the rest, if any.
pop :: Stack a -> Maybe (a, Stack a)
pop = error "TODO: implement pop"

-- | The top, if any.
peek :: Stack a -> Maybe a
peek = error "TODO: implement peek"

-- | How many values.
size :: Stack a -> Int
size = error "TODO: implement size"

-- | Whether there is none.
isEmpty :: Stack a -> Bool
isEmpty = error "TODO: implement isEmpty"
