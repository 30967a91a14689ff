"""What tests share: builders, scripted servers and small clients. Test modules import from here
(and from conftest fixtures by name), never from another test module."""
