// Small progressive enhancements; every page works without this file.
// Copy buttons: <button data-copy="#id" aria-label="..."> copies that element's text (an input's
// value) with the clipboard API and says so in the live region `data-copy-status` names (the
// button's title says it too, for a region that is visually hidden).
document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-copy]");
  if (!button) return;
  const source = document.querySelector(button.dataset.copy);
  const status = document.querySelector(button.dataset.copyStatus || "[data-copy-status]");
  if (!source) return;
  try {
    const text = source instanceof HTMLInputElement ? source.value : source.textContent;
    await navigator.clipboard.writeText(text.trim());
    say(button, status, "Copied to the clipboard.");
  } catch (err) {
    say(button, status, "Copying failed: select the text and copy it yourself.");
  }
});

function say(button, status, message) {
  if (status) status.textContent = message;
  button.title = message;
}

// The start form (form[data-runtime-choice]) shows the fields of the chosen runtime only; without
// this file every runtime's fields show, each under its heading.
function showChosenRuntime(form) {
  const chosen = form.querySelector("input[name=runtime]:checked");
  for (const section of form.querySelectorAll("[data-runtime-fields]")) {
    section.hidden = !chosen || section.dataset.runtimeFields !== chosen.value;
  }
}
document.addEventListener("change", (event) => {
  const form = event.target.closest && event.target.closest("form[data-runtime-choice]");
  if (form && event.target.name === "runtime") showChosenRuntime(form);
});
const showAllChosenRuntimes = () => document.querySelectorAll("form[data-runtime-choice]").forEach(showChosenRuntime);
showAllChosenRuntimes();
window.addEventListener("pageshow", showAllChosenRuntimes); // the browser may restore another choice
