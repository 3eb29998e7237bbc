"""The prompts of `specdec bench --interactive`: general chat, grounded answers and code.

Three kinds of traffic a chat service gets, which reward drafting differently:

  general   open questions the model answers from scratch (nothing to copy);
  grounded  a short passage and a question to answer from it (the answer reuses the
            passage's words, as retrieval-augmented chat does);
  code      small programming tasks.

Each kind has two disjoint sets. `TUNE` is what the drafting decision was developed and
tuned on; `HELD_OUT` is what the bench reports, and nothing was tuned on it. None of
these prompts is in the other bench sets (specdec_tools.bench.prompts, chat_prompts).
Written for this project and fixed.
"""

from __future__ import annotations

KINDS = ("general", "grounded", "code")

_PASSAGES = {
    "library": (
        "The Millbrook public library opens at 9 a.m. on weekdays and at 10 a.m. on "
        "Saturdays; it is closed on Sundays. Members may borrow up to twelve items at a "
        "time for three weeks, and renew each item twice online unless another member "
        "has reserved it. Late returns cost 20 cents per item per day, capped at 5 "
        "dollars per item. The study rooms on the second floor can be booked for two "
        "hours at a time, at most once a day."),
    "battery": (
        "The X200 scooter has a 36-volt, 10-amp-hour battery that gives a range of about "
        "30 kilometres on flat ground at 20 km/h. A full charge takes five hours with the "
        "supplied charger. The battery should be stored between 40 and 80 percent charged "
        "if the scooter is not used for more than a month, and it must not be charged "
        "below 0 degrees Celsius. The battery is covered by a one-year warranty; the "
        "frame by two years."),
    "festival": (
        "The river festival runs from Friday 14 June to Sunday 16 June. Friday evening "
        "opens with a lantern parade that starts at the old bridge at 8 p.m. On Saturday "
        "the rowing races begin at 10 a.m. and the food market stays open until "
        "midnight. Sunday ends with a concert in the park at 6 p.m. Entry to the festival "
        "is free, but the concert needs a ticket, which costs 12 dollars, or 6 dollars "
        "for children under 12."),
    "plant": (
        "Sunpeak tomatoes grow best in full sun with at least six hours of light a day. "
        "Plant seedlings 60 centimetres apart after the last frost, and water deeply "
        "twice a week rather than a little every day. Add a stake or cage when the "
        "plants reach 30 centimetres. The first fruit is usually ready 70 days after "
        "planting; pick it when it is fully red but still firm."),
    "policy": (
        "Employees of Northwind may work from home up to three days a week after "
        "completing their first three months. Requests go to the team lead at least one "
        "week in advance. Core hours are 10 a.m. to 3 p.m., when everyone must be "
        "reachable. Equipment for home offices is reimbursed up to 400 dollars per year "
        "with receipts submitted within 30 days of purchase."),
    "train": (
        "The coastal train leaves Harbour Station every 40 minutes from 6:10 a.m. to "
        "10:50 p.m. The trip to Cliffside takes 55 minutes and stops at Bay Road, the "
        "airport and Pine Point. A single ticket costs 7 dollars and a day pass 15 "
        "dollars; children under six travel free. Bicycles are allowed outside the rush "
        "hours of 7 to 9 a.m. and 4 to 6 p.m."),
    "recipe": (
        "To make the lemon loaf, beat 200 grams of butter with 180 grams of sugar until "
        "pale, then add three eggs one at a time. Fold in 220 grams of flour, two "
        "teaspoons of baking powder and the zest of two lemons. Bake in a lined tin at "
        "170 degrees Celsius for 45 minutes. While it is still warm, pour over a syrup "
        "of the lemons' juice and 60 grams of sugar."),
    "gym": (
        "The Riverside gym offers three memberships. Basic costs 25 dollars a month and "
        "includes the weights room and cardio machines from 6 a.m. to 10 p.m. Plus costs "
        "40 dollars and adds group classes and the pool. Premium costs 60 dollars, opens "
        "all day and night, and includes two personal training sessions a month. Every "
        "membership needs a one-off joining fee of 30 dollars and can be paused for up to "
        "two months a year."),
    "museum": (
        "The city museum is open Tuesday to Sunday from 10 a.m. to 5 p.m., and until 8 "
        "p.m. on Thursdays. Adult tickets cost 14 dollars, students and seniors pay 9, "
        "and visitors under 18 enter free. The dinosaur hall is on the ground floor and "
        "the modern art wing on the third. Guided tours in English leave from the main "
        "hall at 11 a.m. and 2 p.m. and last one hour."),
    "wifi": (
        "To connect to the office Wi-Fi, choose the network called Corp-Secure and sign "
        "in with your staff number and your e-mail password. Guests should use Corp-Guest "
        "with the daily code shown at reception; guest access lasts 24 hours and is "
        "limited to 10 megabits per second. If a laptop cannot connect, forget the "
        "network, restart the Wi-Fi adapter and try again before calling the help desk "
        "on extension 4400."),
    "bike_share": (
        "City bikes can be unlocked with the app or a transit card. The first 30 minutes "
        "of each ride are free with a monthly pass, which costs 15 dollars; after that "
        "every extra 30 minutes costs 2 dollars. Without a pass a ride costs 1 dollar to "
        "unlock plus 20 cents a minute. Bikes must be returned to a docking station; "
        "leaving one elsewhere costs a 25 dollar fee."),
    "clinic": (
        "The Oakview clinic sees patients by appointment from Monday to Friday, 8 a.m. to "
        "6 p.m. Appointments can be booked by phone or online up to four weeks ahead. "
        "Please arrive ten minutes early and bring your health card. Cancellations need "
        "24 hours' notice, or a 20 dollar fee applies. For urgent problems outside "
        "opening hours, call the nurse line, which answers around the clock."),
}


def _grounded(passage: str, question: str) -> str:
    return (f"Answer the question using only the text below.\n\nText: {_PASSAGES[passage]}"
            f"\n\nQuestion: {question}")


TUNE: dict[str, list[tuple[str, str]]] = {
    "general": [
        ("gears", "Explain how a bicycle's gears make climbing hills easier."),
        ("party", "What are some good ways to keep a conversation going at a party?"),
        ("water", "Describe the water cycle for a ten-year-old."),
        ("headphones", "How do noise-cancelling headphones work?"),
        ("thanks", "Write a short note thanking a neighbour for watering my plants."),
        ("dog", "What should I consider before adopting a dog?"),
        ("bread", "Why is bread dough kneaded?"),
        ("photos", "Give three tips for taking better photos with a phone."),
    ],
    "grounded": [
        ("library", _grounded("library", "How long can I keep a book, and what happens "
                                         "if I return it late?")),
        ("battery", _grounded("battery", "How should I store the scooter over the "
                                         "winter?")),
        ("festival", _grounded("festival", "What happens on each day of the festival?")),
        ("plant", _grounded("plant", "How do I plant and water the tomatoes?")),
    ],
    "code": [
        ("reverse", "Write a Python function that reverses the words in a sentence."),
        ("fizzbuzz", "Write FizzBuzz in Python, printing the numbers from 1 to 100."),
        ("stack", "Implement a stack class in Python with push, pop and peek methods."),
        ("vowels", "Write a Python function that counts the vowels in a string."),
    ],
}

HELD_OUT: dict[str, list[tuple[str, str]]] = {
    "general": [
        ("sleep", "What can I do to fall asleep faster at night?"),
        ("bus", "Is it better to take the bus or drive to work, and why?"),
        ("apology", "Help me write a short apology to a friend for missing her birthday."),
        ("snow", "Why is snow white when ice is clear?"),
        ("houseguest", "What makes someone a good houseguest?"),
        ("rainbow", "Why do rainbows appear after rain?"),
        ("meeting", "How do I run a short and useful team meeting?"),
        ("compost", "How do I start composting kitchen scraps at home?"),
    ],
    "grounded": [
        ("policy", _grounded("policy", "When can I work from home, and how do I ask?")),
        ("train", _grounded("train", "How often does the train run, and what does a "
                                     "ticket cost?")),
        ("recipe", _grounded("recipe", "What are the steps to make the lemon loaf?")),
        ("gym", _grounded("gym", "What does each membership cost and include?")),
        ("museum", _grounded("museum", "When is the museum open and how much are "
                                       "tickets?")),
        ("wifi", _grounded("wifi", "How does a guest get online?")),
        ("bike_share", _grounded("bike_share", "How much does a 45-minute ride cost "
                                               "without a pass?")),
        ("clinic", _grounded("clinic", "How do I book an appointment, and what if I "
                                       "need to cancel?")),
    ],
    "code": [
        ("palindrome", "Write a Python function that checks whether a string is a "
                       "palindrome, ignoring case and spaces."),
        ("fibonacci", "Write a Python function that returns the first n Fibonacci "
                      "numbers as a list."),
        ("word_count", "Write a Python function that counts how often each word appears "
                       "in a text and returns a dictionary."),
        ("binary_search", "Implement binary search in Python for a sorted list of "
                          "integers."),
        ("csv_sum", "Write a Python script that reads a CSV file and prints the sum of "
                    "its second column."),
        ("primes", "Write a Python function that returns all prime numbers below n."),
        ("flatten", "Write a Python function that flattens a nested list."),
        ("temperature", "Write a Python function that converts Celsius to Fahrenheit and "
                        "back."),
    ],
}

SETS = {"held-out": HELD_OUT, "tune": TUNE}
