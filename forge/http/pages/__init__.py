"""The HTML pages: one module per area, the helpers every page uses (`common`: the page helper,
the form base, the guards), what every rendered page needs (`context`), refused forms shown again
(`forms`), markdown and highlighting (`render`, `browse_render`) and the forced password change
(`password_gate`)."""
